"""The clusters a torture run injects its faults into: in-process bookies behind
proxies (:class:`HookCluster`), bookie processes (:class:`ProcessCluster`), a ZooKeeper
ensemble's faults (:class:`EnsembleFaults`), a stuck lock on the local store
(:class:`LockFaults`), bookies lost for good (:class:`Losses`) and journal damage."""

from __future__ import annotations

import functools
import os
import random
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from support.metadata import StuckLocker
from support.torture.disks import SmallDisks
from support.torture.plan import BOOKIES, BOOKIE_OPTIONS, CLIENT, DISK_FULL, FSYNC_FAIL, Fault, LOST, METADATA_LOCK, Plan, SESSION_TIMEOUT, ZK_FAULT, ZK_OUTAGE, DOWN, INSTANT
from support.torture.repair import RepairWatch, attempt
from support.torture.workload import Workload
import walkit
from walkit.errors import WalkitError
from walkit.metadata import connect
from walkit.testing import FaultyCluster

if TYPE_CHECKING:
    from support.zk import ZooKeeperEnsemble


# -- clusters ------------------------------------------------------------------------------------

class Cluster(Protocol):
    metadata_uri: str
    losses: Losses

    def begin(self, fault: Fault, workload: Workload) -> str: ...

    def end(self, fault: Fault) -> str: ...

    def lift_all(self) -> list[str]: ...

    def gone(self) -> dict[str, str]: ...

    def live(self) -> set[str]: ...

    def why(self, bookie_id: str) -> str:
        """What the bookie says of its mode (for a ``stuck-read-only`` report)."""
        ...

    def stop(self) -> None: ...


class Bookies(Protocol):
    """What :class:`Losses` needs of a LocalCluster or a FaultyCluster."""

    @property
    def bookie_ids(self) -> list[str]: ...

    @property
    def data_dir(self) -> Path: ...

    def is_running(self, i: int) -> bool: ...

    def kill_bookie(self, i: int) -> None: ...

    def add_bookie(self) -> int: ...


class Losses:
    """A cluster's bookies lost for good, the fresh ones that joined, and the watch on the
    repair (:class:`RepairWatch`) from the first loss on."""

    def __init__(self, uri: str, bookies: Bookies) -> None:
        self.uri, self._bookies = uri, bookies
        self.lost: dict[int, tuple[str, float]] = {}  # bookie number -> (id, time of the loss)
        self.joined: dict[int, tuple[str, float]] = {}  # bookie number -> (id, time it joined)
        self.watch: RepairWatch | None = None

    def lose(self, i: int) -> str:
        """SIGKILL bookie ``i`` (unless it is down already) and delete its journal and
        ledger directories (its log and configuration stay, for whoever reads them)."""
        c = self._bookies
        bookie_id = c.bookie_ids[i]
        if c.is_running(i):
            c.kill_bookie(i)
        self.lost[i] = (bookie_id, time.monotonic())
        for part in ("journal", "ledgers"):  # resolved: on a small disk they are symlinks into its mount
            shutil.rmtree((c.data_dir / f"bookie-{i}" / part).resolve(), ignore_errors=True)
        if self.watch is None:
            self.watch = RepairWatch(self.uri, bookie_id)
        return f"killed, its journal and ledgers deleted: {bookie_id} is lost for good"

    def join(self, planned: int) -> str:
        """Start the fresh bookie, which should get the number ``planned`` the plan gave it."""
        i = self._bookies.add_bookie()
        bookie_id = self._bookies.bookie_ids[i]
        self.joined[i] = (bookie_id, time.monotonic())
        return f"fresh bookie {i} ({bookie_id}) joined" + ("" if i == planned else f", not {planned} as planned")

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()


class HookCluster:
    """In-process bookies with every hook of :class:`walkit.testing.FaultyCluster`."""

    def __init__(self, directory: Path, metadata_uri: str | None) -> None:
        self.cluster = FaultyCluster(directory, BOOKIES, metadata_uri=metadata_uri, session_timeout=SESSION_TIMEOUT,
                                     bookie_options=BOOKIE_OPTIONS)
        self.metadata_uri = self.cluster.metadata_uri
        self.losses = Losses(self.metadata_uri, self.cluster)
        self._ended: set[Fault] = set()
        self._begun: list[Fault] = []

    def begin(self, fault: Fault, workload: Workload) -> str:
        c, b = self.cluster, fault.bookie
        self._begun.append(fault)
        if fault.kind == "kill":
            c.kill_bookie(b)
        elif fault.kind == LOST:
            return self.losses.lose(b)
        elif fault.kind == "partition":
            c.partition(b)
        elif fault.kind == "slow-disk":
            c.slow_disk(b, float(fault.how.split()[0]))
        elif fault.kind == "read-only":
            c.set_read_only(b, True)
        elif fault.kind in ("expire-bookie", "expire-writer"):
            bk = workload.current_client() if fault.kind == "expire-writer" else None
            if fault.kind == "expire-writer" and bk is None:
                return "no in-process writer client"
            if bk is None:  # a session between ZooKeeper nodes is expired once it is back on one
                c.expire_session(b)
            else:
                c.expire_session(client=bk)
        elif fault.kind == "failover":
            return workload.failover(fault.how)
        elif fault.kind == FSYNC_FAIL:
            if not c.is_running(b):
                return "left alone: not running"
            c.fail_sync(b, fault.how, count=1 << 20)  # every sync until the restart: the disk is failing
            return f"{fault.how} fsyncs fail from now on"
        return "done"

    def end(self, fault: Fault) -> str:
        c, b = self.cluster, fault.bookie
        self._ended.add(fault)
        if fault.kind == FSYNC_FAIL:
            return self._replace_failing_disk(b, fault.how)
        if fault.kind == "kill":
            c.restart_bookie(b)
        elif fault.kind == LOST:
            return self.losses.join(BOOKIES)
        elif fault.kind == "partition":
            c.heal(b)
        elif fault.kind == "slow-disk":
            c.slow_disk(b, 0)
        elif fault.kind == "read-only":
            c.set_read_only(b, False)
        return "done"

    def _replace_failing_disk(self, b: int, directory: str) -> str:
        """The operator's answer to a failing disk: the bookie is crashed (it may not stop
        cleanly on it) and restarted once the disk is sound again; it replays its journal."""
        c = self.cluster
        if not c.is_running(b):
            c.fail_sync(b, directory, 0)
            return "not running"
        failure = c.server(b).failure
        c.kill_bookie(b)
        c.fail_sync(b, directory, 0)
        c.restart_bookie(b)
        return f"{'failed' if failure is not None else 'had not synced'}; crashed and restarted"

    def lift_all(self) -> list[str]:
        notes = []
        for fault in self._begun:
            if fault not in self._ended and fault.kind not in INSTANT:
                notes.append(f"lifted {fault}: {attempt(functools.partial(self.end, fault))}")
        return notes

    def gone(self) -> dict[str, str]:
        """The bookies gone for good (id: why)."""
        return {bookie_id: "lost for good" for bookie_id, _ in self.losses.lost.values()}

    def live(self) -> set[str]:
        """The ids of the bookies running now."""
        return {b for i, b in enumerate(self.cluster.bookie_ids) if self.cluster.is_running(i)}

    def why(self, bookie_id: str) -> str:
        server = self.cluster.server(self.cluster.bookie_ids.index(bookie_id))
        return f"read-only {server.readonly}, forced {server.forced_readonly}, failure {server.failure}"

    def stop(self) -> None:
        self.losses.stop()
        self.cluster.stop()


class ProcessCluster:
    """Real bookie processes: SIGKILL, and journal damage while a bookie is down."""

    def __init__(self, directory: Path, metadata_uri: str | None, plan: Plan) -> None:
        victims = {f.bookie for f in plan.faults if f.kind == DISK_FULL}
        self.disks = SmallDisks(directory.parent / "disks", directory, victims)
        try:
            self.cluster = walkit.LocalCluster(directory, BOOKIES, processes=True, metadata_uri=metadata_uri,
                                               session_timeout=SESSION_TIMEOUT, bookie_options=BOOKIE_OPTIONS)
        except BaseException:
            self.disks.release()
            raise
        self.metadata_uri = self.cluster.metadata_uri
        self.losses = Losses(self.metadata_uri, self.cluster)
        self._directory = directory
        self._refused: set[int] = set()  # bookies that refused to start on a damaged journal

    def begin(self, fault: Fault, workload: Workload) -> str:
        if fault.kind == "failover":
            return workload.failover(fault.how)
        if fault.kind == LOST:  # a bookie that refused its damaged journal may be the one lost
            return self.losses.lose(fault.bookie)
        if fault.bookie in self._refused:
            return "left alone: it refused to start on its damaged journal"
        if fault.kind == DISK_FULL:
            return self.disks.fill(fault.bookie, fault.how)
        self.cluster.kill_bookie(fault.bookie)
        if fault.kind == "damage-journal":
            return damage_journal(self._directory / f"bookie-{fault.bookie}" / "journal", fault.how,
                                  random.Random(fault.salt))
        return "killed"

    def end(self, fault: Fault) -> str:
        if fault.kind == LOST:
            return self.losses.join(BOOKIES)
        if fault.kind == DISK_FULL:
            return f"{self._registration(fault.bookie)} when freed; {self.disks.free(fault.bookie)}"
        if fault.kind in DOWN and fault.bookie not in self._refused and not self.cluster.is_running(fault.bookie):
            return self._restart(fault.bookie)
        return "nothing to do"

    def lift_all(self) -> list[str]:
        """Restart every bookie down (but those refused or lost); a loss whose fresh
        bookie has not joined yet was an end the run did not reach, which cannot happen
        (the plan puts it in the first half)."""
        freed = [f"small disk of {note}" for note in self.disks.free_all()]
        return freed + [f"restart of bookie {i}: {attempt(functools.partial(self._restart, i))}"
                        for i in range(len(self.cluster.bookie_ids))
                        if i not in self._refused and i not in self.losses.lost and not self.cluster.is_running(i)]

    def gone(self) -> dict[str, str]:
        """The bookies gone for good (id: why)."""
        ids = self.cluster.bookie_ids
        return {**{ids[i]: "refused its damaged journal" for i in self._refused},
                **{bookie_id: "lost for good" for bookie_id, _ in self.losses.lost.values()}}

    def live(self) -> set[str]:
        """The ids of the bookies running now."""
        return {b for i, b in enumerate(self.cluster.bookie_ids) if self.cluster.is_running(i)}

    def why(self, bookie_id: str) -> str:
        """The last lines of the bookie's log that speak of its mode or an error."""
        log = self._directory / f"bookie-{self.cluster.bookie_ids.index(bookie_id)}" / "bookie.log"
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError as exc:
            return f"no log: {exc}"
        said = [line for line in lines if " ERROR " in line or "read-only" in line or "writable" in line]
        return " | ".join(line[:300] for line in said[-4:]) or "its log says nothing of its mode"

    def _registration(self, i: int) -> str:
        """How bookie ``i`` is registered now: writable, read-only or not at all."""
        bookie_id = self.cluster.bookie_ids[i]
        with connect(self.metadata_uri, session_timeout=CLIENT["session_timeout"]) as meta:
            bookies = meta.bookies()
        return ("writable" if bookie_id in bookies.writable else "read-only" if bookie_id in bookies.readonly
                else "not registered")

    def _restart(self, i: int) -> str:
        """Restart bookie ``i``; one that refuses its damaged journal stays down for good
        (CorruptionError: valid data after a bad frame is never hidden)."""
        try:
            self.cluster.restart_bookie(i)
        except WalkitError as exc:
            if "CorruptionError" in str(exc):
                self._refused.add(i)
            raise
        return "restarted"

    def stop(self) -> None:
        self.losses.stop()
        try:
            self.cluster.stop()
        finally:
            self.disks.release()


class EnsembleFaults:
    """A cluster whose metadata store is a 3-node ZooKeeper ensemble: ``zk-node-down`` and
    ``zk-outage`` (every node) here, every other fault passed on to the bookies' cluster.
    A node's restart does not hold up the schedule (a JVM takes seconds to serve): a
    thread waits for it, and the next ZooKeeper fault waits for that thread, so one node
    at most is ever down but during an outage."""

    def __init__(self, cluster: Cluster, ensemble: ZooKeeperEnsemble) -> None:
        self.cluster = cluster
        self.metadata_uri = cluster.metadata_uri
        self.losses = cluster.losses
        self.ensemble = ensemble
        self.session_client: Callable[[], walkit.BookKeeper | None] = lambda: None
        self._down: dict[Fault, list[int]] = {}
        self._restarting: threading.Thread | None = None
        self.notes: list[str] = []

    def begin(self, fault: Fault, workload: Workload) -> str:
        if fault.kind not in (ZK_FAULT, ZK_OUTAGE):
            return self.cluster.begin(fault, workload)
        e = self.ensemble
        self._wait_restart()
        not_serving = [i for i in range(e.SIZE) if not e.mode(i)]
        if not_serving:
            return f"left alone: node {not_serving[0]} is not serving"
        try:
            victims, why = (list(range(e.SIZE)), "every node") if fault.kind == ZK_OUTAGE else self._victim(fault.how)
            for victim in victims:
                e.kill(victim)
        except RuntimeError as exc:
            return f"failed: {str(exc).splitlines()[0][:200]}"
        self._down[fault] = victims
        return f"killed node{'s' if len(victims) > 1 else ''} {', '.join(map(str, victims))} ({why})"

    def _victim(self, how: str) -> tuple[list[int], str]:
        """The node to kill: the leader, or the node holding the session of the ledger
        writer's client (the leader when that is not known)."""
        client = self.session_client() if how == "session" else None
        if client is not None:
            session = getattr(client.client.cluster.store, "session_id", 0)
            node = self.ensemble.node_of_session(session) if session else None
            if node is not None:
                return [node], f"the ledger writer's session 0x{session:x}"
        return [self.ensemble.leader(timeout=10)], "leader"

    def end(self, fault: Fault) -> str:
        if fault.kind not in (ZK_FAULT, ZK_OUTAGE):
            return self.cluster.end(fault)
        victims = self._down.pop(fault, None)
        if victims is None:
            return "nothing to do"
        names = ", ".join(map(str, victims))

        def restart() -> None:
            self.notes.append(f"ZooKeeper node{'s' if len(victims) > 1 else ''} {names} restarted: "
                              f"{self._restart(*victims)}")

        self._restarting = threading.Thread(target=restart, name="torture-zk-restart", daemon=True)
        self._restarting.start()
        return f"restarting node{'s' if len(victims) > 1 else ''} {names}"

    def _wait_restart(self) -> None:
        if self._restarting is not None:
            self._restarting.join()
            self._restarting = None

    def _restart(self, *nodes: int) -> str:
        """Start ``nodes`` again on their own data (together: an ensemble needs a quorum to
        serve) and wait until each serves."""
        started = time.monotonic()
        try:
            for i in nodes:
                if not self.ensemble.running(i):
                    self.ensemble.start(i)
            for i in nodes:
                self.ensemble.wait_serving(i)
        except RuntimeError as exc:
            return f"failed: {str(exc).splitlines()[0][:200]}"
        return f"serving after {time.monotonic() - started:.1f} s"

    def lift_all(self) -> list[str]:
        self._wait_restart()
        down = [i for i in range(self.ensemble.SIZE) if not self.ensemble.mode(i)]
        notes = [f"restart of ZooKeeper nodes {down}: {self._restart(*down)}"] if down else []
        return self.notes + notes + self.cluster.lift_all()

    def gone(self) -> dict[str, str]:
        return self.cluster.gone()

    def live(self) -> set[str]:
        return self.cluster.live()

    def why(self, bookie_id: str) -> str:
        return self.cluster.why(bookie_id)

    def stop(self) -> None:
        self.cluster.stop()


class LockFaults:
    """A cluster on the embedded ``local://`` store: ``metadata-lock`` here (another
    process takes the database's write lock and is SIGSTOPped, then killed at the
    fault's end), every other fault passed on to the bookies' cluster."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.metadata_uri = cluster.metadata_uri
        self.losses = cluster.losses
        self._file = Path(self.metadata_uri.removeprefix("local://")) / "metadata.sqlite"
        self._lockers: dict[Fault, StuckLocker] = {}

    def begin(self, fault: Fault, workload: Workload) -> str:
        if fault.kind != METADATA_LOCK:
            return self.cluster.begin(fault, workload)
        self._lockers[fault] = StuckLocker(self._file)
        return f"{self._file.name} locked by a stuck process (pid {self._lockers[fault].proc.pid})"

    def end(self, fault: Fault) -> str:
        if fault.kind != METADATA_LOCK:
            return self.cluster.end(fault)
        locker = self._lockers.pop(fault, None)
        if locker is None:
            return "nothing to do"
        locker.release()
        return "the stuck process killed: lock released"

    def lift_all(self) -> list[str]:
        notes = [f"lifted {fault}: {self.end(fault)}" for fault in list(self._lockers)]
        return notes + self.cluster.lift_all()

    def gone(self) -> dict[str, str]:
        return self.cluster.gone()

    def live(self) -> set[str]:
        return self.cluster.live()

    def why(self, bookie_id: str) -> str:
        return self.cluster.why(bookie_id)

    def stop(self) -> None:
        for locker in self._lockers.values():
            locker.release()
        self.cluster.stop()


def damage_journal(directory: Path, how: str, rng: random.Random) -> str:
    """Truncate the newest journal with frames inside its last 64 KiB of frames, or flip
    one byte there. Replay must drop a torn tail and refuse (CorruptionError) valid
    frames after a bad one; either way no acknowledged record may be lost, since the
    other copies of each entry are intact."""
    from bookie.fs.real import RealFS
    from bookie.journal._files import list_journals
    from bookie.journal._format import journal_name
    from bookie.journal._replay import scan_journal

    fs = RealFS()
    for jid in reversed(list_journals(fs, str(directory))):
        frames, stop, alignment = scan_journal(fs, str(directory), jid)
        if not frames:
            continue
        path = directory / journal_name(jid)
        offset = rng.randrange(max(alignment, stop.offset - (64 << 10)), stop.offset)
        if how == "truncate":
            os.truncate(path, offset)
            return f"journal {jid:x} truncated at {offset} (frames ended at {stop.offset})"
        with open(path, "r+b") as fh:
            fh.seek(offset)
            byte = fh.read(1)
            fh.seek(offset)
            fh.write(bytes([byte[0] ^ 0x5A]))
        return f"journal {jid:x}: byte {offset} flipped (frames ended at {stop.offset})"
    return "no journal with frames"
