"""Journal frames packed in C (``bookie._frames``) against the Python reference.

``FrameBuffer`` packs ENTRY frames through ``bookie._frames`` when it is built; the
Python path stays the reference. These tests pack the same records both ways and compare
the bytes - frame by frame, buffer by buffer - including the cases the C code hands
back to Python (ids out of range, payloads that are not flat byte buffers) and the
buffer boundaries where a batch moves to its next segment.
"""

from __future__ import annotations

import array
import os
import random
import struct
import subprocess
import sys
from typing import Any

import pytest
from crc32c import crc32c

from bookie import native
from bookie.fs import AlignedBuffer
from bookie.fs.mem import MemFS
from bookie.journal import _framing
from bookie.journal._format import FLAG_FLUSH_START, FRAME_HEADER, FrameType
from bookie.journal._framing import ENTRY, FrameBuffer

needs_c = pytest.mark.skipif(_framing.C_FRAMING is None, reason="bookie._frames is not built or not usable here")

ALIGN = 512
_KEY, _FENCE, _LAC = int(FrameType.MASTER_KEY), int(FrameType.FENCE), int(FrameType.LAC)


class Pool:
    """The journal's buffer pool, reduced: buffers of ``size`` (or larger when asked)."""

    def __init__(self, size: int) -> None:
        self.fs, self.size = MemFS(), size

    def get(self, min_size: int) -> AlignedBuffer:
        return self.fs.alloc_buffer(max(self.size, -(-min_size // ALIGN) * ALIGN))

    def put(self, buf: AlignedBuffer) -> None:
        buf.close()


def frame_buffer(c: bool, size: int = 8 * ALIGN, seed: int = 0x1234_5678) -> FrameBuffer:
    pool = Pool(size)
    fb = FrameBuffer(ALIGN, pool.get, pool.put, c_framing=c)
    fb.seed = seed
    return fb


def batch_bytes(fb: FrameBuffer) -> list[bytes]:
    return [bytes(buf.view[:n]) for buf, n in fb.take()]


def random_entries(rng: random.Random, n: int, max_size: int) -> list[tuple[int, int, Any]]:
    out: list[tuple[int, int, Any]] = []
    for i in range(n):
        data = rng.randbytes(rng.choice((0, 1, 7, 100, 1000, rng.randrange(max_size + 1))))
        kind = rng.randrange(3)
        payload: Any = data if kind == 0 else bytearray(data) if kind == 1 else memoryview(data)
        out.append((rng.getrandbits(64), rng.randrange(-(1 << 63), 1 << 63), payload))
    return out


@needs_c
def test_the_c_crc_is_crc32c() -> None:
    """Every length around the three-lane rounds (lanes of 2 KiB, 256 and 64 bytes), any
    seed, any alignment."""
    c = _framing.C_FRAMING
    rng = random.Random(5)
    data = rng.randbytes(70_000)
    lanes = [3 * 64, 3 * 256, 3 * 2048]  # the three-lane rounds' sizes, and their sums
    edges = {k + d for k in [*lanes, 768 + 192, 6144 + 768 + 192, 1048, 2 * 768 + 192] for d in (-9, -8, -1, 0, 1, 8)}
    for n in [*range(0, 80), *sorted(edges), 12288, 12289, 20_000, 65_536, 69_999]:
        for start in (0, 1, 3):
            seed = rng.getrandbits(32)
            chunk = data[start:start + n]
            assert c.crc32c(chunk, seed) == crc32c(chunk, seed), (n, start, seed)
    assert c.crc32c(b"123456789") == 0xE3069283, "the CRC-32C check value"


@needs_c
@pytest.mark.parametrize("seed", [0, 1, 0xFFFF_FFFF])
def test_entries_framed_in_c_are_the_python_frames(seed: int) -> None:
    """Random entries (bytes, bytearray, memoryview payloads; 0 B to several buffers),
    appended in chunks of random sizes and one at a time: byte for byte the Python
    frames, in the same segments, the first frame alone flagged FLUSH_START."""
    rng = random.Random(seed)
    for round_ in range(30):
        entries = random_entries(rng, rng.randrange(1, 60), 3 * 8 * ALIGN)
        cuts = sorted(rng.sample(range(1, len(entries)), min(3, len(entries) - 1))) if len(entries) > 1 else []
        chunks = [entries[a:b] for a, b in zip([0, *cuts], [*cuts, len(entries)])]
        got, want = frame_buffer(True, seed=seed), frame_buffer(False, seed=seed)
        for chunk in chunks:
            if rng.random() < 0.3:
                for ledger, entry, data in chunk:
                    got.append(ENTRY, ledger, entry, data)
                    want.append(ENTRY, ledger, entry, data)
            else:
                got.append_entries(chunk)
                want.append_entries(chunk)
                assert got.framed == want.framed == len(chunk)
            assert got.size == want.size
        c_bytes, py_bytes = batch_bytes(got), batch_bytes(want)
        assert c_bytes == py_bytes, f"round {round_}: the C frames differ from Python's"
        first = c_bytes[0]
        assert first[5] & FLAG_FLUSH_START
        crc, ftype, flags, _, length = FRAME_HEADER.unpack_from(first)
        assert ftype == ENTRY and crc == crc32c(first[4:FRAME_HEADER.size + length], seed)


@needs_c
def test_c_and_python_frames_interleave_with_other_records() -> None:
    """Master keys, fences and LACs (always packed in Python) between C-packed entries:
    one stream of frames, the same as Python's alone."""
    got, want = frame_buffer(True), frame_buffer(False)
    for fb in (got, want):
        fb.append(_KEY, 9, 0, b"key")
        fb.append(ENTRY, 9, 0, b"a" * 700)
        fb.append(_FENCE, 9, 0, b"")
        fb.append_entries([(9, 1, b"b" * 3000), (9, 2, b"")])
        fb.append(_LAC, 9, 2, b"")
    assert batch_bytes(got) == batch_bytes(want)


@needs_c
@pytest.mark.parametrize("bad", [
    (-1, 0, b"x"),  # ledger id below 0
    (1 << 64, 0, b"x"),  # ledger id past u64
    (1, 1 << 63, b"x"),  # entry id past i64
    (1, 0, "text"),  # not bytes
    (1, 0, memoryview(array.array("I", [1, 2]))),  # not a byte buffer
    (1.0, 0, b"x"),  # not an int
], ids=["negative-ledger", "big-ledger", "big-entry", "str", "uint-array", "float"])
def test_what_c_does_not_frame_python_refuses_as_before(bad: tuple[Any, Any, Any]) -> None:
    """A value C does not frame goes to the Python path: the same error, the entries
    before it framed (``framed`` says how many), the same bytes so far."""
    good = [(1, 0, b"a" * 100), (1, 1, b"b" * 5000)]
    errors = []
    streams = []
    for c in (True, False):
        fb = frame_buffer(c)
        with pytest.raises(Exception) as info:
            fb.append_entries([*good, bad, (1, 3, b"never")])
        assert fb.framed == len(good)
        errors.append(type(info.value))
        with pytest.raises(Exception) as one:
            fb.append(ENTRY, *bad)
        errors.append(type(one.value))
        streams.append(batch_bytes(fb))
    assert errors[:2] == errors[2:], f"C then Python: {errors}"
    assert streams[0] == streams[1]


@needs_c
def test_odd_but_frameable_values_go_through_python() -> None:
    """An int subclass and a bytes subclass: C hands them back (or frames them) - the
    bytes are Python's either way."""

    class Id(int):
        pass

    class Blob(bytes):
        pass

    entries = [(Id(5), Id(6), Blob(b"xyz")), (True, 0, bytearray(b"q")), (3, 4, memoryview(b"abcdef")[1:5])]
    got, want = frame_buffer(True), frame_buffer(False)
    got.append_entries(entries)
    want.append_entries(entries)
    assert batch_bytes(got) == batch_bytes(want)


class _ShortLen(bytes):
    def __len__(self) -> int:
        return 0


@needs_c
@pytest.mark.parametrize("data", [
    memoryview(b"x").cast("B", shape=[]),  # 0-dimensional
    _ShortLen(b"x" * 20_000),  # len() says less than the buffer holds
], ids=["0-dim-view", "short-len"])
def test_payloads_python_refuses_are_refused_the_same_way(data: Any) -> None:
    """A payload whose buffer is not what Python's slice assignment takes - a 0-d view,
    a len() that disagrees with its bytes (which once made C ask for room forever) -
    goes to the Python path and fails as it always did, through the journal too."""
    got, want = frame_buffer(True), frame_buffer(False)
    errors = []
    for fb in (got, want):
        with pytest.raises(Exception) as info:
            fb.append_entries([(1, 0, b"a"), (1, 1, data)])
        assert fb.framed == 1
        errors.append(type(info.value))
        with pytest.raises(Exception) as one:
            fb.append(ENTRY, 1, 2, data)
        errors.append(type(one.value))
    assert errors[:2] == errors[2:], errors
    assert batch_bytes(got) == batch_bytes(want)


@needs_c
def test_entries_of_any_iterable_are_framed() -> None:
    """``append_entries`` of a tuple or a generator (not a list: C takes lists) frames
    what Python frames."""
    entries = [(1, i, bytes([i]) * 300) for i in range(20)]
    got, want = frame_buffer(True), frame_buffer(False)
    got.append_entries(tuple(entries))
    got.append_entries(e for e in entries)
    want.append_entries(entries)
    want.append_entries(entries)
    assert got.framed == want.framed == 20
    assert batch_bytes(got) == batch_bytes(want)


@needs_c
def test_a_keyboard_interrupt_in_an_id_is_not_swallowed() -> None:
    """An exception that is no Exception (KeyboardInterrupt, raised by a signal handler
    while an id's __index__ ran) leaves the C call, and nothing counts as framed."""

    class Interrupting:
        def __index__(self) -> int:
            raise KeyboardInterrupt

    class InterruptedLen(bytes):
        calls = 0

        def __len__(self) -> int:  # the signal arrives once: a swallowed one is not raised again
            InterruptedLen.calls += 1
            if InterruptedLen.calls == 1:
                raise KeyboardInterrupt
            return bytes.__len__(self)

    fb = frame_buffer(True)
    with pytest.raises(KeyboardInterrupt):
        fb.append_entries([(1, 0, b"a" * 10), (1, Interrupting(), b"b")])
    assert fb.framed == 0 and fb.size == 0
    with pytest.raises(KeyboardInterrupt):
        fb.append_entries([(1, 0, InterruptedLen(b"c"))])  # raised in the payload's len(), in C
    assert fb.framed == 0 and fb.size == 0


@needs_c
def test_the_c_calls_refuse_a_window_outside_the_buffer() -> None:
    c = _framing.C_FRAMING
    buf = bytearray(64)
    with pytest.raises(ValueError):
        c.frame_entry(buf, 0, 65, 0, True, 1, 1, b"x")
    with pytest.raises(ValueError):
        c.frame_entries(buf, 10, 5, 0, True, [], 0)
    with pytest.raises(BufferError):
        c.frame_entry(bytes(64), 0, 64, 0, True, 1, 1, b"x")  # read-only
    assert c.frame_entry(buf, 0, 64, 0, True, 1, 1, b"y" * 40) == -68, "no room: nothing written, the size said"
    assert buf == bytearray(64)
    assert c.frame_entries(buf, 0, 64, 0, True, [(1, 1, b"y" * 40)], 0) == (0, 0, 1, 68)
    assert c.frame_entry(buf, 0, 64, 0, True, -1, 1, b"y") == 0, "not framed here: Python's"
    with pytest.raises(ValueError):
        c.frame_entries(buf, 0, 64, 0, True, [], -1)
    end = c.frame_entry(buf, 0, 64, 7, False, 1, 2, b"y" * 36)
    assert end == 64 and buf[5] == 0, "not the batch's first buffer: no FLUSH_START"
    assert struct.unpack_from("<I", buf)[0] == crc32c(bytes(buf[4:64]), 7)


@needs_c
def test_one_entry_in_c_takes_only_plain_values() -> None:
    """``frame_entry`` (``FrameBuffer.append_entry``, ``Journal.log_entry``'s one call)
    frames ids of type int and bytes-like payloads of the three types the journal's check
    takes; anything else comes back unframed before any of its own code ran (an
    ``__index__`` that would raise KeyboardInterrupt is never called), for the caller to
    check. Plain values make the reference's bytes."""

    class Id(int):
        pass

    class Interrupting:
        def __index__(self) -> int:
            raise KeyboardInterrupt

    c = _framing.C_FRAMING
    buf = bytearray(4096)
    for odd in [(True, 1, b"x"), (1, Id(1), b"x"), (Interrupting(), 1, b"x"), (1, Interrupting(), b"x"),
                (1, 1, array.array("B", b"x")), (1, 1, memoryview(array.array("I", [1])))]:
        assert c.frame_entry(buf, 0, 4096, 0, True, *odd) == 0, odd
        assert buf == bytearray(4096)
    got, want = frame_buffer(True, size=2 * ALIGN + 600), frame_buffer(False, size=2 * ALIGN + 600)
    plain: list[tuple[int, int, bytes | bytearray | memoryview]] = [
        (1, 2, b"x" * 500), (3, 4, bytearray(b"y" * 300)), (5, -6, memoryview(b"z" * 900)[100:]), (7, 8, b"")]
    assert all(got.append_entry(*e) for e in plain), "plain values are framed in C"
    assert not got.append_entry(True, 1, b"x") and not frame_buffer(False).append_entry(1, 2, b"x")
    for e in plain:
        want.append(ENTRY, *e)
    assert batch_bytes(got) == batch_bytes(want)


def test_walkit_native_off_keeps_the_c_framing_out() -> None:
    """``WALKIT_NATIVE=off`` (in a fresh interpreter): every frame packed in Python."""
    code = "from bookie.journal import _framing; print(_framing.C_FRAMING is None)"
    env = {**os.environ, "WALKIT_NATIVE": "off"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


@pytest.mark.skipif(not native.HAS_NATIVE, reason="the I/O shim is not built: require fails on it first")
@pytest.mark.parametrize("mode", ["auto", "require"])
def test_a_missing_frames_extension_falls_back_or_fails_under_require(mode: str) -> None:
    """Without ``bookie._frames`` (its import blocked, in a fresh interpreter): ``auto``
    frames in Python, ``require`` fails at import with a message naming it."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'bookie._frames': raise ImportError('blocked by the test')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from bookie.journal import _framing\n"
        "print(_framing.C_FRAMING is None)\n"
    )
    env = {**os.environ, "WALKIT_NATIVE": mode}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if mode == "auto":
        assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr
    else:
        assert out.returncode != 0 and "bookie._frames (walkit's C frame packing) is not built" in out.stderr


def _padding_frame(pad: int, seed: int) -> bytes:
    """A PADDING frame as docs/format.md has it, its CRC computed over its bytes."""
    frame = bytearray(pad)
    FRAME_HEADER.pack_into(frame, 0, 0, FrameType.PADDING, 0, 0, pad - FRAME_HEADER.size)
    struct.pack_into("<I", frame, 0, crc32c(bytes(frame[4:]), seed))
    return bytes(frame)


def test_padding_frames_of_every_length_and_seed_are_the_format_s() -> None:
    """The PADDING frame's CRC is kept per length and seed: batches of every fill, in a
    buffer full of old frames, and after the seed changed (a new file), end with the
    frame computed from scratch."""
    fb = frame_buffer(False, seed=1)
    rng = random.Random(7)
    for seed in (1, 2, 1):
        fb.seed = seed
        sizes = [*range(0, 40), *rng.sample(range(40, 3 * ALIGN), 60)]
        for size in sizes + sizes:  # each length twice: made, then taken from the cache
            fb.buf.view[:] = b"\xaa" * len(fb.buf)  # what a recycled buffer holds
            fb.append(ENTRY, 3, size, b"x" * size)
            fill = fb.fill
            (buf, n), = fb.take()
            pad = n - fill
            assert pad >= FRAME_HEADER.size and n % ALIGN == 0
            assert bytes(buf.view[fill:n]) == _padding_frame(pad, seed), (seed, size)
