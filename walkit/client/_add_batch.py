"""A ledger writer's adds in batches: the adds the loop took from the queue go out in
one call per bookie, and a bookie's acknowledgements come back in runs.

Theory of operation
-------------------
:meth:`LedgerWriter.take_incoming <walkit.client._writer.LedgerWriter.take_incoming>`
takes every add queued since its last call (tens to hundreds with 1,000 adds in flight).
Sent one by one (``LedgerWriter._send``), each add cost an :class:`AddEntry`, a call of
the pool per add and of the connection per add and bookie, and three dict entries per
bookie; answered one by one, each acknowledgement went through three calls before the
writer's ``on_ack``, and the add that made the oldest one complete ran the completion
pass for that add alone. Here, when nothing stands in the way (:func:`send_taken`):

* each add is encoded (the LAC piggybacked as ``_send`` does) and given its write set
  and send time, then each bookie of the ensemble gets the adds its write set has (all
  of them when E = Qw) in one :meth:`BookieClient.queue_adds
  <walkit.client._bookie_client.BookieClient.queue_adds>` - the same frames, in the same
  order, as ``_send`` would have queued. When the loop takes many writers at once
  (:meth:`ClientCore._send_ready <walkit.client._core.ClientCore._send_ready>`: a
  thousand ledgers written round-robin, an add or two each), their runs are gathered
  per bookie for the pass (:class:`~walkit.client._bookie_client.AddGroups`) and each
  bookie gets them all in one :meth:`BookieClient.queue_add_groups
  <walkit.client._bookie_client.BookieClient.queue_add_groups>` - frames of different
  ledgers share the write, each writer's in its entry order - and the ensemble's
  connections are looked up once per ensemble, not once per writer;
* a bookie's EOK answers that arrive together reach :func:`acked` as one list (their
  relay is the bookie's :class:`~walkit.client._bookie_client.AckRelay`): each add
  counts the ack as ``on_ack`` would, and the writer's completion pass runs once for the
  run (and again whenever the run moves on to another writer's adds), so the adds it
  completes are completed - and their slots given back - together. Any other answer
  (an error, a lost connection) goes to ``on_ack`` as before, one by one.

What stands in the way, and sends the batch one add at a time as before: a writer that
failed or settles for Qa acks in recovery (``_degraded``), a failed bookie still in the
ensemble (an ensemble change under way), or a bookie of the ensemble not connected
through a usable walkit connection (connecting, lost, or an Apache BookKeeper bookie:
``BookiePool.ready``). In-order completion, quorum counting, ensemble changes, timeouts
and fencing are the writer's, unchanged.
"""

from __future__ import annotations

import collections
import functools
import time
from typing import Protocol

from walkit.client._add_queue import Add
from walkit.client._bookie_client import AckRelay, AddGroups, AddRun
from walkit.client._core import ClientCore
from walkit.client._entry_codec import Encoder
from walkit.client._pool import BookiePool
from walkit.client._writer_lac import LacPublisher
from walkit.errors import WalkitError
from walkit.protocol import Response

__all__ = ["BatchWriter", "acked", "send_taken"]

_UNSEEN: list[list[AddRun]] = []  # (an identity) no writer of the pass looked up this ensemble yet
_relays: dict[str, AckRelay] = {}  # bookie -> the relay of its answers to batched adds (immutable: shared)


class BatchWriter(Protocol):
    """What the batches see of their :class:`~walkit.client._writer.LedgerWriter`."""

    core: ClientCore
    ledger_id: int
    key: bytes
    recovery: bool
    lac: int
    error: WalkitError | None
    failed: set[str]
    ensemble: tuple[str, ...]
    quorum_size: int
    pending: collections.deque[Add]
    _degraded: bool
    _encode: Encoder
    _write_sets: list[tuple[str, ...]]
    lacs: LacPublisher

    def _complete_ready(self) -> None: ...


def send_taken(writer: BatchWriter, batch: list[Add], sink: AddGroups | None = None) -> bool:
    """(Loop) Make ``batch`` - adds just taken from ``writer``'s queue, in entry order -
    pending and send each to its write set, one call per bookie; False (and nothing
    done) when something stands in the way (module docstring): the caller sends them one
    by one. With ``sink`` (one pass of :meth:`ClientCore._send_ready` over many writers)
    each bookie's run goes there instead, to be queued with the runs
    of the other writers of the pass in one call per bookie (:class:`AddGroups
    <walkit.client._bookie_client.AddGroups>`)."""
    if writer.error is not None or writer._degraded:
        return False
    ensemble, failed = writer.ensemble, writer.failed
    if failed and not failed.isdisjoint(ensemble):
        return False
    clients = targets = None
    if sink is None:
        clients = writer.core.pool.ready(ensemble)
    else:  # the pass's lists for this ensemble, found by the pass's first writer on it
        targets = sink.ready.get(ensemble, _UNSEEN)
        if targets is _UNSEEN:
            targets = _targets(writer.core.pool, ensemble, sink)
    if clients is None and targets is None:
        return False
    ledger_id, lac, encode, write_sets = writer.ledger_id, writer.lac, writer._encode, writer._write_sets
    size = len(write_sets)
    now = time.monotonic() if sink is None else sink.now  # (one clock read per pass of many writers)
    for add in batch:
        add.data = encode(ledger_id, add.entry_id, lac, add.length, add.payload)
        add.sent_at = now
        add.sent = write_sets[add.entry_id % size]  # the write set's own tuple, as _send gives it
    lacs = writer.lacs
    if lac > lacs.piggybacked or lacs.idle_since:  # as _send: the LAC rides on these entries
        lacs.carried(lac, now)
    writer.pending.extend(batch)
    key, recovery, qw = writer.key, writer.recovery, len(write_sets[0])
    # the bookie at ``index`` is in entry e's write set when (index - e) mod E < Qw
    if targets is not None:  # the pass's runs of the ensemble's bookies: one group for each
        if qw == size:
            whole = (ledger_id, key, recovery, batch)
            for runs in targets:
                runs.append(whole)
            return True
        for index, runs in enumerate(targets):
            run = [add for add in batch if (index - add.entry_id) % size < qw]
            if run:
                runs.append((ledger_id, key, recovery, run))
        return True
    assert clients is not None
    for index, (bookie, client) in enumerate(zip(ensemble, clients)):
        run = batch if qw == size else [add for add in batch if (index - add.entry_id) % size < qw]
        if run:
            client.queue_adds(ledger_id, key, recovery, run, _relay(bookie))
    return True


def _targets(pool: BookiePool, ensemble: tuple[str, ...], sink: AddGroups) -> list[list[AddRun]] | None:
    """The lists of the pass ``sink`` that gather the runs to each of ``ensemble``'s
    bookies, in the ensemble's order; None when one of them has no usable connection
    (:meth:`BookiePool.ready <walkit.client._pool.BookiePool.ready>`). Made once per
    ensemble and pass (:func:`send_taken` finds them in ``sink.ready`` afterwards), not
    once per writer."""
    clients = pool.ready(ensemble)
    targets = None if clients is None else [sink.runs_of(client, _relay(bookie))
                                            for bookie, client in zip(ensemble, clients)]
    sink.ready[ensemble] = targets
    return targets


def _relay(bookie: str) -> AckRelay:
    relay = _relays.get(bookie)
    if relay is None:
        relay = _relays[bookie] = AckRelay(functools.partial(acked, bookie), functools.partial(_one, bookie))
    return relay


def _one(bookie: str, response: Response | None, error: WalkitError | None, add: Add) -> None:
    """Any answer of ``bookie`` to ``add`` but a run's EOK: the writer's ``on_ack``."""
    add.writer.on_ack(add, bookie, error)


def acked(bookie: str, adds: list[Add]) -> None:
    """(Loop) ``bookie`` acknowledged ``adds`` (each durable there), in this order: each
    counts the ack as ``LedgerWriter.on_ack`` counts a success, and each writer whose
    oldest pending add has its quorum then completes what is ready, once for the run."""
    writer: BatchWriter | None = None
    owner: object = None  # the writer of the adds before (an identity test)
    need = 0
    for add in adds:
        if add.writer is not owner:
            if writer is not None and writer.pending and writer.pending[0].quorum:
                writer._complete_ready()
            owner = add.writer
            switched: BatchWriter = owner  # type: ignore[assignment]  # (no cast() call per switch)
            writer, need = switched, switched.quorum_size
        if add.done or bookie not in add.sent or bookie in add.acked:
            continue  # late: completed already, or from a bookie since replaced
        add.acked += (bookie,)
        if len(add.acked) >= need:
            add.quorum = True
    if writer is not None and writer.pending and writer.pending[0].quorum:
        writer._complete_ready()
