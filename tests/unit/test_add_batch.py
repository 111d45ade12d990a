"""A writer's adds in batches (walkit/client/_add_batch.py): BookieClient.queue_adds sends
what one add at a time sent, and hands a bookie's acknowledgements on in runs, in the
order they came; ``acked`` counts them as on_ack does and completes once per run."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from walkit.client._add_batch import acked
from walkit.client._add_queue import Add
from walkit.client._bookie_client import AckRelay, BookieClient
from walkit.client._submit import QuickFuture
from walkit.errors import BookieUnavailableError, FrameTooLargeError, LedgerFencedError, WalkitError
from walkit.protocol import AddEntry, AddEntryResponse, ErrorResponse, Op, ReadLac, ReadLacResponse, Status
from walkit.protocol._connection import ServerConnection

KEY = b"k" * 32


class Wire:
    """A transport that keeps what is written."""

    def __init__(self) -> None:
        self.written = b""

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


def connected(max_frame_size: int = 1 << 20) -> tuple[BookieClient, Wire]:
    client = BookieClient("b1:1", max_frame_size)
    wire = client._transport = Wire()  # type: ignore[assignment]
    return client, wire  # type: ignore[return-value]


class Sent:
    """What a batch reads of an add: its id and its bytes."""

    def __init__(self, entry_id: int, data: bytes) -> None:
        self.entry_id, self.data = entry_id, data


def test_queue_adds_sends_what_one_add_at_a_time_sent() -> None:
    async def go() -> None:
        one, one_wire = connected()
        run, run_wire = connected()
        adds = [Sent(3 + i, b"entry-%d" % i * (i + 1)) for i in range(5)]
        for add in adds:
            assert one.try_request_cb(AddEntry(9, add.entry_id, KEY, add.data, True), lambda r, e, c: None, add)
        run.queue_adds(9, KEY, True, adds, AckRelay(lambda adds: None, lambda r, e, c: None))
        one.flush()
        run.flush()
        assert run_wire.written == one_wire.written and len(run_wire.written) > 5 * 65
        assert run._wire.pending_ids() == [1, 2, 3, 4, 5] and run.in_flight == 5
        assert list(run._contexts.values()) == adds
    asyncio.run(go())


def test_acks_go_on_in_runs_in_the_order_they_came() -> None:
    """EOK answers to batched adds in a row: one ``acked`` call per run; an error answer,
    or an answer to another request, ends the run and is handed on where it came."""
    async def go() -> None:
        client, _ = connected()
        heard: list[Any] = []
        relay = AckRelay(lambda adds: heard.append(("run", list(adds))), lambda r, e, c: heard.append(("one", e, c)))
        client.queue_adds(9, KEY, False, [Sent(i, b"x") for i in range(4)], relay)  # ids 1-4
        client.request_cb(ReadLac(9), lambda r, e, c: heard.append(("lac", r.lac)), None)  # type: ignore[union-attr]  # id 5
        client.queue_adds(9, KEY, False, [Sent(i, b"x") for i in range(4, 6)], relay)  # ids 6-7
        server = ServerConnection()
        answers = b"".join([
            server.send(AddEntryResponse(9, 1, request_id=2)), server.send(AddEntryResponse(9, 0, request_id=1)),
            server.send(ErrorResponse(Op.ADD_ENTRY, Status.EFENCED, 9, 2, request_id=3)),
            server.send(AddEntryResponse(9, 3, request_id=4)), server.send(ReadLacResponse(9, 2, request_id=5)),
            server.send(AddEntryResponse(9, 4, request_id=6)),
        ])
        client._received(answers)
        entries = [[add.entry_id for add in item[1]] if item[0] == "run" else item for item in heard]
        assert entries[:2] == [[1, 0], ("one", entries[1][1], entries[1][2])]
        assert isinstance(heard[1][1], LedgerFencedError) and heard[1][2].entry_id == 2
        assert entries[2:] == [[3], ("lac", 2), [4]]
        heard.clear()
        client._lost(BookieUnavailableError("gone", bookie="b1:1"))
        assert [(kind, type(e), c.entry_id) for kind, e, c in heard] == [("one", BookieUnavailableError, 5)]
    asyncio.run(go())


def test_an_entry_over_the_frame_limit_fails_alone() -> None:
    async def go() -> None:
        client, wire = connected(max_frame_size=4096)
        heard: list[Any] = []
        relay = AckRelay(lambda adds: heard.extend(adds), lambda r, e, c: heard.append((e, c.entry_id)))
        client.queue_adds(9, KEY, False, [Sent(0, b"a"), Sent(1, b"b" * 5000), Sent(2, b"c")], relay)
        assert sorted(client._pending) == [1, 3] and sorted(client._contexts) == [1, 3]
        await asyncio.sleep(0)
        assert len(heard) == 1 and isinstance(heard[0][0], FrameTooLargeError) and heard[0][1] == 1
        assert b"b" * 5000 not in wire.written and wire.written.count(KEY) == 2
    asyncio.run(go())


class Writer:
    """What ``acked`` sees of a writer: its quorum, its pending adds, its completion pass."""

    def __init__(self, quorum_size: int) -> None:
        self.quorum_size = quorum_size
        self.pending: collections.deque[Add] = collections.deque()
        self.passes: list[list[int]] = []
        self.error: WalkitError | None = None

    def add(self, entry_id: int, sent: tuple[str, ...]) -> Add:
        add = Add(self, entry_id, b"", 0, QuickFuture())  # type: ignore[arg-type]
        add.sent = sent
        self.pending.append(add)
        return add

    def _complete_ready(self) -> None:
        done = []
        while self.pending and self.pending[0].quorum:
            done.append(self.pending.popleft().entry_id)
        self.passes.append(done)

    def on_ack(self, add: Add, bookie: str, error: WalkitError | None) -> None:
        raise AssertionError("a run's acks do not go one by one")


def test_acked_counts_as_on_ack_and_completes_once_per_run() -> None:
    ws = ("a", "b", "c")
    one, two = Writer(2), Writer(2)
    a = [one.add(i, ws) for i in range(4)]
    b = [two.add(i, ws) for i in range(2)]
    replaced = one.add(4, ("a", "c", "d"))  # "b" was replaced in its write set
    acked("a", a + b)
    assert not any(add.quorum for add in a + b) and one.passes == two.passes == []
    a[2].done = True  # completed already (failed): a late ack changes nothing
    acked("b", [a[1], a[0], b[0], a[2], a[3], replaced, a[0]])  # a[0] twice: counted once
    assert [add.acked for add in a] == [("a", "b"), ("a", "b"), ("a",), ("a", "b")]
    assert replaced.acked == () and not replaced.quorum
    # a pass when the run moved on to the other writer's add and at the end - each only while the
    # oldest pending add has its quorum (a[2]'s ack is late: writer one's head stays waiting)
    assert one.passes == [[0, 1]] and two.passes == [[0]]
    acked("c", [b[1]])
    assert two.passes == [[0], [1]] and not two.pending


def test_queue_add_groups_sends_the_runs_of_several_ledgers_as_one_add_at_a_time_did() -> None:
    """A pass over many writers queues their runs to a bookie in one call: the frames,
    ids and contexts are those of each add sent alone, ledger after ledger (each run in
    its order, its own key and recovery flag), and an entry over the frame limit fails
    alone, the ids going on past it."""
    async def go() -> None:
        one, one_wire = connected(max_frame_size=4096)
        grouped, grouped_wire = connected(max_frame_size=4096)
        other_key = b"o" * 32
        groups = [(9, KEY, False, [Sent(3, b"a"), Sent(4, b"bb")]), (12, other_key, True, [Sent(0, b"c" * 5000), Sent(1, b"g")]),
                  (15, KEY, False, [Sent(7, b"d"), Sent(8, b"e"), Sent(9, b"f")])]
        for ledger_id, key, recovery, adds in groups:
            for add in adds:
                if len(add.data) < 4000:
                    assert one.try_request_cb(AddEntry(ledger_id, add.entry_id, key, add.data, recovery),
                                              lambda r, e, c: None, add)
                else:
                    one._wire._next_id += 1  # (refused by the grouped call: its id is used up there too)
        heard: list[Any] = []
        grouped.queue_add_groups(groups, AckRelay(lambda adds: None, lambda r, e, c: heard.append((e, c.entry_id))))
        one.flush()
        grouped.flush()
        assert grouped_wire.written == one_wire.written and grouped_wire.written.count(other_key) == 1
        assert grouped._wire.pending_ids() == [1, 2, 4, 5, 6, 7] == sorted(grouped._pending)
        assert [add.data for add in grouped._contexts.values()] == [b"a", b"bb", b"g", b"d", b"e", b"f"]
        await asyncio.sleep(0)
        assert len(heard) == 1 and isinstance(heard[0][0], FrameTooLargeError) and heard[0][1] == 0
    asyncio.run(go())
