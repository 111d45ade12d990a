"""The end of a torture run's repair: every ledger back to its write quorum (no closed
ledger names a bookie gone for good, no under-replication marker left) and every
bookie writable again; ledgers abandoned by a lost writer are closed first."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from support.torture.history import Anomaly
from support.torture.plan import CLIENT, PASSWORDS, REPAIR_WAIT, WRITABLE_WAIT
import walkit
from walkit.errors import NoSuchLedgerError, UnauthorizedError, WalkitError
from walkit.metadata import Cluster as MetadataCluster
from walkit.metadata import LedgerMetadata, LedgerState, UnderReplication, connect


# -- the repair ------------------------------------------------------------------------------------

def _names(meta: LedgerMetadata) -> set[str]:
    return {b for _, ensemble in meta.ensembles for b in ensemble}


class RepairWatch:
    """From a loss on, which ledgers name the lost bookie, once a second, and when none
    does any more: what autorecovery repaired and how long it took. (Judged by
    :func:`await_write_quorum` at the end; this is the report's account.)"""

    def __init__(self, uri: str, bookie: str) -> None:
        self._uri, self.bookie = uri, bookie
        self.lost_at = time.monotonic()
        self.named: set[int] = set()  # every ledger seen naming the bookie
        self.naming: set[int] = set()  # those naming it at the latest look
        self.existing: set[int] = set()
        self.repaired_at: float | None = None  # since when no ledger names it
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="torture-repair-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            cluster = connect(self._uri, session_timeout=CLIENT["session_timeout"])
        except WalkitError:
            self.errors += 1
            return
        with cluster:
            opened: set[int] = set()  # ledgers open at the latest look: an ensemble change may add the bookie
            while not self._stop.wait(1.0):
                try:
                    opened = self._look(cluster, opened)
                except WalkitError:
                    self.errors += 1

    def _look(self, cluster: MetadataCluster, opened: set[int]) -> set[int]:
        ids = set(cluster.ledgers.ledger_ids())
        still_open: set[int] = set()
        for ledger_id in sorted((ids - self.existing) | (self.naming & ids) | (opened & ids)):
            try:
                meta, _ = cluster.ledgers.read(ledger_id)
            except NoSuchLedgerError:
                continue
            if meta.state is not LedgerState.CLOSED:
                still_open.add(ledger_id)
            if self.bookie in _names(meta):
                self.naming.add(ledger_id)
                self.named.add(ledger_id)
            else:
                self.naming.discard(ledger_id)
        self.existing, self.naming = ids, self.naming & ids
        if self.naming:
            self.repaired_at = None
        elif self.repaired_at is None:
            self.repaired_at = time.monotonic()
        return still_open

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def account(self) -> str:
        """Ledgers repaired (seen naming the bookie, existing, naming it no more) and how long it took."""
        if not self.named and self.repaired_at is not None:
            return ("autorecovery: no ledger named the lost bookie (it held nothing, or it had been down long "
                    "enough to be repaired before)")
        repaired = len((self.named & self.existing) - self.naming)
        deleted = len(self.named - self.existing)
        took = f"in {self.repaired_at - self.lost_at:.1f} s" if self.repaired_at is not None else "not finished"
        return (f"autorecovery: {repaired} ledgers repaired {took} from the loss ({deleted} more deleted meanwhile, "
                f"{len(self.naming)} still naming it{f', {self.errors} looks failed' if self.errors else ''})")


def await_write_quorum(uri: str, gone: dict[str, str], timeout: float = REPAIR_WAIT) -> tuple[list[Anomaly], str]:
    """After the run, every fault lifted and every ledger recovered: wait until no closed
    ledger names a bookie ``gone`` for good (lost, or refused its damaged journal) and no
    under-replication marker is left; an ``under-replicated`` anomaly if that takes over
    ``timeout`` seconds.

    A ledger still open then has no writer left (the end-of-run recoveries closed every
    ledger the workloads know; what stays open was abandoned: e.g. a segment a WAL writer
    created just before its SIGKILL, never named by the log). If it is marked or names a
    gone bookie, the check closes it first (a recovery open), as BookKeeper's
    replication worker would after ``openLedgerRereplicationGracePeriod`` - walkit's
    waits for the writer - and says so."""
    started, closed = time.monotonic(), None
    verdict: tuple[list[int], list[int], list[int]] | None = None
    while True:
        error = ""
        try:
            with connect(uri, session_timeout=CLIENT["session_timeout"]) as cluster:
                markers = UnderReplication(cluster.store, cluster.info)
                if closed is None:
                    closed = _close_abandoned(uri, cluster, markers, set(gone))
                verdict = _under_replicated(cluster, markers, set(gone))
        except WalkitError as exc:
            error = f", {summary_of(exc)}"
        waited = time.monotonic() - started
        if verdict is not None and not error and not verdict[0] and not verdict[1]:
            still_open = f"; open ledgers left alone: {verdict[2]}" if verdict[2] else ""
            return [], f"every ledger at its write quorum after {waited:.1f} s{closed or ''}{still_open}"
        if waited > timeout:
            break
        time.sleep(0.5)
    naming, marked, opened = verdict or ([], [], [])
    detail = (f"after {timeout:g} s, closed ledgers naming a bookie gone for good ({', '.join(sorted(gone)) or '-'}): "
              f"{naming[:10]}, marked: {marked[:10]}, open: {opened[:10]}{closed or ''}{error}")
    return [Anomaly("under-replicated", f"cluster: {detail}")], f"not every ledger at its write quorum: {detail}"


def await_writable(uri: str, expected: set[str], why: Callable[[str], str],
                   timeout: float = WRITABLE_WAIT) -> tuple[list[Anomaly], str]:
    """After the run, every fault lifted: wait until every bookie of ``expected`` (those
    running and not gone for good) is registered writable again - a bookie read-only
    for a full disk must come back once space is freed, one whose fsync failed once it
    was restarted; a ``stuck-read-only`` anomaly if one is not after ``timeout`` s, with
    what each such bookie says of itself (``why``)."""
    started, state = time.monotonic(), ""
    while True:
        try:
            with connect(uri, session_timeout=CLIENT["session_timeout"]) as cluster:
                bookies = cluster.bookies()
            missing = sorted(expected - set(bookies.writable))
            state = f"read-only: {sorted(expected & set(bookies.readonly))}, not registered: " \
                    f"{sorted(expected - set(bookies.writable) - set(bookies.readonly))}"
        except WalkitError as exc:
            missing, state = sorted(expected), summary_of(exc)
        waited = time.monotonic() - started
        if not missing:
            return [], f"every bookie writable after {waited:.1f} s"
        if waited > timeout:
            said = "; ".join(f"{b} says: {_said(why, b)}" for b in missing)
            detail = f"after {timeout:g} s, not writable: {missing} ({state}); {said}"
            return [Anomaly("stuck-read-only", f"cluster: {detail}")], detail
        time.sleep(0.5)


def _said(why: Callable[[str], str], bookie_id: str) -> str:
    try:
        return why(bookie_id)
    except Exception as exc:  # noqa: BLE001 - a report, whatever the bookie's state
        return f"unknown ({exc!r})"


def _under_replicated(cluster: MetadataCluster, markers: UnderReplication,
                      gone: set[str]) -> tuple[list[int], list[int], list[int]]:
    """Closed ledgers naming a bookie of ``gone``, ledgers marked under-replicated, open ledgers."""
    naming, opened = [], []
    for ledger_id in cluster.ledgers.ledger_ids():
        try:
            meta, _ = cluster.ledgers.read(ledger_id)
        except NoSuchLedgerError:
            continue
        if meta.state is not LedgerState.CLOSED:
            opened.append(ledger_id)
        elif _names(meta) & gone:
            naming.append(ledger_id)
    return naming, markers.ledgers(), opened


def _close_abandoned(uri: str, cluster: MetadataCluster, markers: UnderReplication, gone: set[str]) -> str:
    """Close (recovery open) every open ledger that is marked or names a bookie of
    ``gone``; a note naming them ("" if none)."""
    marked = set(markers.ledgers())
    abandoned = []
    for ledger_id in cluster.ledgers.ledger_ids():
        try:
            meta, _ = cluster.ledgers.read(ledger_id)
        except NoSuchLedgerError:
            continue
        if meta.state is not LedgerState.CLOSED and (ledger_id in marked or _names(meta) & gone):
            abandoned.append(ledger_id)
    if not abandoned:
        return ""
    with walkit.BookKeeper(uri, **CLIENT) as bk:
        outcomes = [f"{ledger_id} ({_close_one(bk, ledger_id)})" for ledger_id in abandoned]
    return f"; abandoned open ledgers closed by the check: {', '.join(outcomes)}"


def _close_one(bk: walkit.BookKeeper, ledger_id: int) -> str:
    """Recover and close one ledger, with the password of whichever workload made it."""
    for password in PASSWORDS:
        try:
            bk.open_ledger(ledger_id, password, recovery=True).close()
            return "closed"
        except UnauthorizedError:
            continue
        except WalkitError as exc:
            return f"failed: {summary_of(exc)}"
    return "failed: no workload's password"
def attempt(action: Callable[[], str]) -> str:
    try:
        return action()
    except WalkitError as exc:
        return f"failed: {summary_of(exc)}"


def summary_of(exc: BaseException) -> str:
    """The error's first line, and the last error its quoted bookie log names."""
    lines = str(exc).splitlines() or [""]
    quoted = [line.strip() for line in lines[1:] if "Error" in line]
    return f"{type(exc).__name__}: {lines[0][:200]}" + (f" | {quoted[-1][:300]}" if quoted else "")
