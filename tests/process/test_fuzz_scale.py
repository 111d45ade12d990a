"""Protocol fuzzing of a bookie process at scale (issue 18): frames - valid requests of every
kind and mutated ones (bytes flipped, cut, inserted, lengths and headers rewritten,
random noise) - are sent over many concurrent connections to a real ``python -m bookie``
while a well-behaved client keeps adding and reading back its own ledger. Throughout,
that client must keep being served (no stall longer than 10 s); at the end the bookie
process's RSS may not have grown by more than 64 MiB over its size once warm, and it
still serves a fresh client.

CI sends 20,000 frames; ``WALKIT_SLOW=1`` sends 1,000,000 (``WALKIT_FUZZ_FRAMES`` sets
any count). The hypothesis-driven, in-process fuzzer is tests/cluster/test_fuzz_bookie.py; this
one trades shrinking for volume. Results of long runs are in docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import os
import random
import struct
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.bookie import KEY, BookieProcess, Usage, entry
from walkit.client import BookieClient
from walkit.protocol import (
    DEFAULT_MAX_FRAME_SIZE,
    AddEntry,
    GetBookieInfo,
    ReadEntry,
    ReadLac,
    Request,
    WriteLac,
    encode_request,
)
from support.zk import free_port

pytestmark = pytest.mark.timeout(3600)

FRAMES = int(os.environ.get("WALKIT_FUZZ_FRAMES") or (1_000_000 if os.environ.get("WALKIT_SLOW") else 20_000))
CONNECTIONS = 8
PER_CONNECTION = 50  # frames sent on one connection before it is half-closed
GOOD_LEDGER = 10**9  # far from the fuzzed ids (0..64)
STALL = 10.0


def _request(rng: random.Random) -> Request:
    ledger, e = rng.randint(0, 64), rng.randint(0, 8)
    kind = rng.randrange(7)
    if kind == 0:
        return AddEntry(ledger, e, KEY, entry(ledger, e))
    if kind == 1:
        return AddEntry(ledger, e, rng.randbytes(rng.randint(1, 64)), rng.randbytes(rng.randint(0, 300)))
    if kind == 2:
        return ReadEntry(ledger, rng.choice([-1, e, rng.randint(0, 2**63 - 1)]))
    if kind == 3:
        return ReadEntry(ledger, e, previous_lac=e - 1, timeout_ms=rng.randint(0, 50))
    if kind == 4:
        return ReadLac(rng.randint(0, 2**63 - 1))
    if kind == 5:
        return WriteLac(ledger, e, KEY)
    return GetBookieInfo()


def _mutate_inside(rng: random.Random, frame: bytes) -> bytes:
    """Bytes flipped after the length prefix, or the header rewritten: the frame stays one
    frame, so the bookie must parse it, answer or refuse it, and read on."""
    out = bytearray(frame)
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.3 and len(out) >= 8:
            out[4:8] = rng.randbytes(4)
        elif len(out) > 4:
            out[rng.randrange(4, len(out))] ^= rng.randint(1, 255)
    return bytes(out)


def _desync(rng: random.Random, frame: bytes) -> bytes:
    """A frame cut, grown, given a lying length, or noise: the stream cannot be framed past it."""
    out = bytearray(frame)
    how = rng.randrange(4)
    if how == 0:
        del out[rng.randrange(len(out)):]
    elif how == 1:
        i = rng.randint(4, len(out))
        out[i:i] = rng.randbytes(rng.randint(1, 16))
    elif how == 2:
        out[:4] = struct.pack(">I", rng.choice([0, 1, 3, 4, 7, 8, 100, DEFAULT_MAX_FRAME_SIZE,
                                                DEFAULT_MAX_FRAME_SIZE + 1, 2**32 - 1]))
    else:
        out = bytearray(rng.randbytes(rng.randint(0, 400)))
    return bytes(out)


def _payload(rng: random.Random, count: int, counts: dict[str, int]) -> bytes:
    """``count`` frames for one connection: valid requests, then up to 5 mutated inside
    (below the bookie's bad-frame limit), and in half the connections a last frame that
    breaks the framing. Bad frames come last: a bookie may close a connection at its
    first bad frame, and every valid one before it must have been answered."""
    bad = min(rng.randint(0, 5), count)
    desync = 1 if count > bad and rng.random() < 0.5 else 0
    valid = count - bad - desync
    frames = [encode_request(_request(rng)) for _ in range(valid)]
    frames += [_mutate_inside(rng, encode_request(_request(rng))) for _ in range(bad)]
    frames += [_desync(rng, encode_request(_request(rng))) for _ in range(desync)]
    counts["valid"] += valid
    counts["mutated"] += bad
    counts["desync"] += desync
    return b"".join(frames)


async def _fuzz_connection(port: int, payload: bytes) -> None:
    """Send, half-close, read until the bookie closes (bounded: it must not hang us)."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return
    try:
        writer.write(payload)
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        await asyncio.wait_for(_drain(reader), 30)
    except (ConnectionError, OSError):
        return  # closed on us mid-send: an answer too
    finally:
        writer.close()


async def _drain(reader: asyncio.StreamReader) -> None:
    while await reader.read(65536):
        pass


async def _good_client(port: int, progress: list[float], stop: asyncio.Event) -> None:
    client = await BookieClient.connect("127.0.0.1", port)
    try:
        n = 0
        while not stop.is_set():
            await client.add_entry(GOOD_LEDGER, n, KEY, entry(GOOD_LEDGER, n))
            assert (await client.read_entry(GOOD_LEDGER, n)).data == entry(GOOD_LEDGER, n)
            n += 1
            progress[0] = time.monotonic()
            progress[1] = n
    finally:
        await client.close()


async def _fuzz(port: int, frames: int, pid: int, rng: random.Random) -> dict[str, float]:
    progress = [time.monotonic(), 0.0]
    stop = asyncio.Event()
    good = asyncio.create_task(_good_client(port, progress, stop))
    sent = 0
    counts = {"valid": 0, "mutated": 0, "desync": 0}
    worst_stall = 0.0
    warm: Usage | None = None
    started = time.monotonic()
    try:
        while sent < frames:
            batch = []
            for _ in range(CONNECTIONS):
                count = min(PER_CONNECTION, frames - sent)
                if count <= 0:
                    break
                batch.append(_fuzz_connection(port, _payload(rng, count, counts)))
                sent += count
            await asyncio.gather(*batch)
            if good.done():
                good.result()  # its error, if it failed
                raise AssertionError("the good client stopped")
            worst_stall = max(worst_stall, time.monotonic() - progress[0])
            assert worst_stall < STALL, f"the good client was not served for {worst_stall:.1f} s"
            if warm is None and sent >= min(frames // 10, 20_000):
                warm = Usage.of(pid)
    finally:
        stop.set()
        await asyncio.wait_for(good, 30)
    assert warm is not None
    end = Usage.of(pid)
    return {"sent": sent, **counts, "seconds": time.monotonic() - started, "good_rounds": progress[1],
            "worst_stall": worst_stall, "rss_warm": warm.rss, "rss_end": end.rss, "fds_end": end.fds}


def _answered(metrics_port: int) -> float:
    """Requests the bookie answered, every op and status (its /metrics)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as response:
        text = response.read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "walkit_bookie_requests_total")


def test_a_flood_of_random_and_mutated_frames_never_stops_the_good_client(tmp_path: Path) -> None:
    metrics_port = free_port()
    bookie = BookieProcess(tmp_path / "bookie", httpServerEnabled=True, httpServerPort=metrics_port).start()
    try:
        assert bookie.proc is not None
        out = asyncio.run(_fuzz(bookie.port, FRAMES, bookie.proc.pid, random.Random(18)))
        answered = _answered(metrics_port)
        print(f"fuzz: {out['sent']:.0f} frames ({out['valid']:.0f} valid, {out['mutated']:.0f} mutated inside, "
              f"{out['desync']:.0f} breaking the framing) in {out['seconds']:.1f} s, {CONNECTIONS} connections at a "
              f"time; the bookie answered {answered:.0f} requests; good client {out['good_rounds']:.0f} add+read "
              f"rounds, worst stall {out['worst_stall']:.2f} s; bookie RSS {out['rss_warm'] / 2**20:.0f} -> "
              f"{out['rss_end'] / 2**20:.0f} MiB, {out['fds_end']:.0f} fds")
        assert out["sent"] == FRAMES and out["good_rounds"] > 0
        # the valid requests were read, parsed and answered - all but those still queued behind the
        # connection's read limit when a bad frame after them made the bookie close it
        assert answered >= 0.9 * out["valid"] + 2 * out["good_rounds"], (answered, out)
        assert out["rss_end"] <= out["rss_warm"] + (64 << 20), "the bookie's memory grew with the flood"

        async def fresh() -> None:
            client = await BookieClient.connect("127.0.0.1", bookie.port)
            try:
                await client.add_entry(GOOD_LEDGER + 1, 0, KEY, entry(GOOD_LEDGER + 1, 0))
                assert (await client.read_entry(GOOD_LEDGER + 1, 0)).data == entry(GOOD_LEDGER + 1, 0)
            finally:
                await client.close()

        asyncio.run(asyncio.wait_for(fresh(), 30))
        assert bookie.terminate() == 0, bookie.log()[-3000:]
    finally:
        bookie.close()
