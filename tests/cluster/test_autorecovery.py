"""Autorecovery (walkit/recovery/_autorecovery.py, _markers.py, ``walkit autorecovery``) on
real bookie processes, both metadata drivers: a bookie SIGKILLed and its disks wiped is
healed by the daemons alone (every fragment back to three copies, then a second original
member lost too - every acknowledged entry still reads back); the auditor's seat moves
when its bookie dies; two workers racing for markers repair each ledger once; a worker
killed mid-ledger leaves its marker to another once its session is gone; a bookie back
before ``lostBookieRecoveryDelay`` is not re-replicated; a ledger deleted while marked is
dropped; an open ledger's live fragment waits for its writer (the ones behind it are
repaired); the off switch; the periodic copy check.

Every scenario is parametrized over both drivers. Four of them, whose use of the driver
(a SIGKILLed daemon's ephemerals, a session's lock) the others already make on both, run
on one by default (two on ``zk://``, two on ``local://``: the file's time budget), on both
with ``WALKIT_SLOW=1``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import walkit
from support.client import client, index_of, local_cluster, raw_add
from support.metadata import Driver, driver  # noqa: F401  (fixture)
from test_recovery import _all_metadata, _cli, _copies, _lose, _quiet, _readonly, _write
from walkit.cli import main as cli_main
from walkit.client import BookieClient
from walkit.errors import NoSuchLedgerError
from walkit.metadata import Cluster, LedgerMetadata, LedgerState, connect
from walkit.recovery import AutoRecovery, AutoRecoveryConfig, UnderReplication

pytestmark = pytest.mark.timeout(240)

SESSION = 2.0  # the bookies' (and in-process daemons') metadata session timeout, as local_cluster sets it
DAEMONS = {"auto_recovery_daemon_enabled": True, "lost_bookie_recovery_delay": 1}
DOOMED_SESSION = 4.0  # the session of a daemon the test SIGKILLs (``--session-timeout``)
NEVER = 600.0  # a lostBookieRecoveryDelay no test waits for: that daemon's auditor marks nothing by itself


def _one_driver_unless_slow(driver: Driver, default: str) -> None:
    """Run on ``default`` only, unless ``WALKIT_SLOW`` is set (see the module docstring)."""
    if driver.spec.driver != default and not os.environ.get("WALKIT_SLOW"):
        pytest.skip(f"the {driver.spec.driver}:// variant runs with WALKIT_SLOW=1")


# --- helpers -----------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _metadata(cluster: walkit.LocalCluster) -> Iterator[tuple[Cluster, UnderReplication]]:
    """One metadata session for the test's own looks (markers, ensembles, registrations)."""
    with connect(cluster.metadata_uri, session_timeout=SESSION) as md:
        yield md, UnderReplication(md.store, md.info)


@contextlib.contextmanager
def _daemon(cluster: walkit.LocalCluster, owner: str, config: AutoRecoveryConfig) -> Iterator[AutoRecovery]:
    """A standalone daemon in this process (its counters readable), stopped on exit."""
    daemon = AutoRecovery(cluster.metadata_uri, owner, config, session_timeout=SESSION)
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.stop()
    assert daemon.error is None, daemon.error


def _naming(md: Cluster, bookie: str) -> list[int]:
    """The ledgers whose ensembles name ``bookie``."""
    out = []
    for ledger_id in md.ledgers.ledger_ids():
        meta, _ = md.ledgers.read(ledger_id)
        if any(bookie in ensemble for _, ensemble in meta.ensembles):
            out.append(ledger_id)
    return out


def _registered(md: Cluster) -> set[str]:
    bookies = md.bookies()
    return set(bookies.writable | bookies.readonly)


def _logs(cluster: walkit.LocalCluster) -> str:
    """What the bookies' autorecovery daemons said (for a failure's message)."""
    lines = []
    for i in range(len(cluster.bookie_ids)):
        path = cluster.data_dir / f"bookie-{i}" / "bookie.log"
        if path.exists():
            lines += [f"[{i}] {line}" for line in path.read_text(errors="replace").splitlines()
                      if "auditor" in line or "autorecovery" in line or "replication worker" in line]
    return "\n".join(lines[-60:])


def _until(predicate: Callable[[], bool], timeout: float, what: str,
           cluster: walkit.LocalCluster | None = None) -> float:
    """Wait (bounded) for ``predicate``; the seconds it took."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what}: not within {timeout:.0f} s\n" + (_logs(cluster) if cluster else ""))
        time.sleep(0.1)
    return time.monotonic() - start


def _auditor(ur: UnderReplication, cluster: walkit.LocalCluster) -> str:
    """The bookie whose daemon holds the auditor's seat (one takes it within a tick or two)."""
    _until(lambda: ur.auditor() is not None, 15, "an auditor", cluster)
    auditor = ur.auditor()
    assert auditor is not None and auditor in cluster.bookie_ids, auditor
    return auditor


def _healed(md: Cluster, ur: UnderReplication, lost: str) -> Callable[[], bool]:
    return lambda: not ur.ledgers() and not _naming(md, lost)


def _assert_three_copies(cluster: walkit.LocalCluster, metas: list[LedgerMetadata], upto: int | None = None) -> None:
    """Every bookie of every entry's write set holds the entry (entries before ``upto``)."""
    for meta in metas:
        held = _copies(cluster, meta)
        for e in range(meta.last_entry_id + 1 if upto is None else upto):
            for bookie in meta.write_set(e):
                assert e in held.get(bookie, set()), (meta.ledger_id, e, bookie)


def _read_back(bk: walkit.BookKeeper, data: dict[tuple[int, int], bytes], passwords: dict[int, bytes]) -> None:
    for ledger_id, password in passwords.items():
        rh = bk.open_ledger(ledger_id, password=password)
        n = sum(1 for lid, _ in data if lid == ledger_id)
        assert rh.last_add_confirmed == n - 1
        assert [e.data for e in rh.read(0, n - 1)] == [data[(ledger_id, e)] for e in range(n)]


def _held(cluster: walkit.LocalCluster, bookie: str, ledger_id: int, first: int, last: int) -> set[int]:
    """The entries of ``first..last`` that ``bookie`` stores (ADMIN ledger.entries; none: no such ledger)."""

    async def go() -> set[int]:
        c = await BookieClient.connect(*cluster.bookie_address(index_of(cluster, bookie)))
        try:
            held: set[int] = set()
            for start in range(first, last + 1, 65536):
                try:
                    answer = await c.admin("ledger.entries", {"ledger": ledger_id, "first": start,
                                                              "last": min(last, start + 65535)})
                except NoSuchLedgerError:
                    return set()
                held.update(answer["entries"])
            return held
        finally:
            await c.close()

    return asyncio.run(go())


def _ensembles(metas: list[LedgerMetadata]) -> dict[int, tuple[tuple[int, tuple[str, ...]], ...]]:
    return {m.ledger_id: m.ensembles for m in metas}


def _autorecovery(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """``walkit autorecovery ARGS`` run in this process (as ``_cli`` runs it in a child, without
    the interpreter's start): what it printed."""
    capsys.readouterr()
    assert cli_main(["autorecovery", *args]) == 0
    return capsys.readouterr().out


def _cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> object:
    return json.loads(_autorecovery(capsys, *args, "--json"))


def _writing_until_named(bk: walkit.BookKeeper, md: Cluster, bookie: str, rng: random.Random) -> tuple[
        dict[tuple[int, int], bytes], dict[int, bytes]]:
    """Closed ledgers, written until at least two name ``bookie`` (ensembles are chosen at random)."""
    data: dict[tuple[int, int], bytes] = {}
    passwords: dict[int, bytes] = {}
    named = 0
    while named < 2:
        assert len(passwords) < 40, "the client never picks that bookie"
        more, pw = _write(bk, 1, 20, rng)
        data.update(more)
        passwords.update(pw)
        ledger_id = next(iter(pw))
        if bookie in md.ledgers.read(ledger_id)[0].ensembles[0][1]:
            named += 1
    return data, passwords


# --- the scenario: autorecovery alone --------------------------------------------------------------------
def test_autorecovery_alone_heals_a_lost_bookie_and_a_second_loss_loses_nothing(tmp_path: Path,
                                                                                driver: Driver) -> None:
    rng = random.Random(16)
    with local_cluster(tmp_path, driver, bookies=5, processes=True, bookie_options=DAEMONS) as cluster, \
            client(cluster) as bk, _metadata(cluster) as (md, ur):
        data, passwords = _write(bk, 6, 40, rng)
        with walkit.WriteAheadLog.open(cluster.metadata_uri, "healed", ensemble_size=3, write_quorum=3,
                                       ack_quorum=2) as wal:
            records = [wal.append(b"record-%d" % i) for i in range(200)]
        original = _all_metadata(cluster.metadata_uri)
        assert len(original) > len(passwords)  # the log's segments too
        lost = original[0].ensembles[0][1][0]
        named = _naming(md, lost)
        _lose(cluster, index_of(cluster, lost))
        _until(_healed(md, ur, lost), 60, f"no ledger names {lost}, no marker left", cluster)
        healed = _all_metadata(cluster.metadata_uri)
        assert {m.ledger_id for m in healed} == {m.ledger_id for m in original}
        assert all(m.state is LedgerState.CLOSED for m in healed)
        before = _ensembles(original)
        changed = {m.ledger_id for m in healed if m.ensembles != before[m.ledger_id]}
        assert changed == set(named)  # only the lost bookie's ledgers were touched
        _assert_three_copies(cluster, healed)
        second = next(b for _, ens in original[0].ensembles for b in ens if b != lost)
        _lose(cluster, index_of(cluster, second))
        _read_back(bk, data, passwords)
        with walkit.WriteAheadLog.open(cluster.metadata_uri, "healed") as wal:
            assert [lsn for lsn, _ in wal.replay()] == records


def test_the_auditor_seat_moves_when_its_bookie_dies_and_that_bookie_is_healed(tmp_path: Path,
                                                                               driver: Driver) -> None:
    _one_driver_unless_slow(driver, "local")  # zk:// sees a SIGKILLed daemon's ephemerals go in the worker test
    rng = random.Random(17)
    with local_cluster(tmp_path, driver, bookies=5, processes=True, bookie_options=DAEMONS) as cluster, \
            client(cluster) as bk, _metadata(cluster) as (md, ur):
        auditor = _auditor(ur, cluster)
        data, passwords = _writing_until_named(bk, md, auditor, rng)
        _lose(cluster, index_of(cluster, auditor))  # the auditor, and one more lost bookie
        took = _until(lambda: ur.auditor() not in (None, auditor), SESSION + 5, "another daemon audits", cluster)
        successor = ur.auditor()
        assert successor is not None and cluster.is_running(index_of(cluster, successor)), took
        _until(_healed(md, ur, auditor), 60, f"the old auditor {auditor} re-replicated", cluster)
        _assert_three_copies(cluster, _all_metadata(cluster.metadata_uri))
        _read_back(bk, data, passwords)
        assert ur.auditor() == successor


# --- workers and their locks -----------------------------------------------------------------------------------
def test_a_marker_lock_has_one_owner_until_its_session_ends(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=0) as cluster:
        a, b = connect(cluster.metadata_uri), connect(cluster.metadata_uri)
        try:
            ua, ub = UnderReplication(a.store, a.info), UnderReplication(b.store, b.info)
            ua.mark(7, ["x:1"])
            ub.mark(7, ["y:2"])  # merged into the marker
            assert ua.lock(7, "a") and not ub.lock(7, "b") and ua.lock(7, "a")  # the owner may ask again
            marker = ub.read(7)
            assert marker is not None and marker.locked_by == "a" and marker.bookies == {"x:1", "y:2"}
            ub.mark(7, ["z:3"])  # the auditor adds a bookie while "a" repairs
            assert not ua.complete(marker)  # kept, unlocked, for another round
            kept = ub.read(7)
            assert kept is not None and kept.locked_by is None and "z:3" in kept.bookies
            assert ua.lock(7, "a") and not ub.lock(7, "b")
            a.close()  # the winner's session ends: its lock goes with it
            assert ub.lock(7, "b")
            again = ub.read(7)
            assert again is not None and again.locked_by == "b"
            assert ub.complete(again) and ub.ledgers() == [] and ub.read(7) is None
            assert not ub.lock(7, "b")  # no marker, nothing to lock
        finally:
            a.close()
            b.close()


def test_two_workers_racing_repair_each_ledger_once(tmp_path: Path, driver: Driver) -> None:
    rng = random.Random(18)
    with local_cluster(tmp_path, driver, bookies=5, processes=True) as cluster, client(cluster) as bk, \
            _metadata(cluster) as (md, ur):
        data, passwords = _write(bk, 6, 30, rng)
        lost = _all_metadata(cluster.metadata_uri)[0].ensembles[0][1][0]
        named = _naming(md, lost)
        for ledger_id in named:
            ur.mark(ledger_id, [lost])
        _lose(cluster, index_of(cluster, lost))
        _until(lambda: lost not in _registered(md), SESSION + 5, "the lost bookie unregistered")
        config = AutoRecoveryConfig(lost_bookie_recovery_delay=NEVER)  # only the markers made here
        with _daemon(cluster, "w1", config) as w1, _daemon(cluster, "w2", config) as w2:
            _until(_healed(md, ur, lost), 60, "both workers done")
        assert w1.repaired + w2.repaired == len(named) and w1.marked + w2.marked == 0  # stopped: counts final
        for meta in _all_metadata(cluster.metadata_uri):
            if meta.ledger_id in named:  # the copies went to one target: no other bookie holds any
                ensemble_bookies = {b for _, ens in meta.ensembles for b in ens}
                for bookie in set(cluster.bookie_ids) - ensemble_bookies - {lost}:
                    assert _held(cluster, bookie, meta.ledger_id, 0, meta.last_entry_id) == set(), bookie
        _assert_three_copies(cluster, _all_metadata(cluster.metadata_uri))
        _read_back(bk, data, passwords)


def _run_daemon(cluster: walkit.LocalCluster, owner: str, *args: str) -> subprocess.Popen[bytes]:
    """``walkit autorecovery run`` as an operator starts it (its metadata session: 10 s unless
    ``--session-timeout`` says otherwise)."""
    return subprocess.Popen([sys.executable, "-m", "walkit.cli", "autorecovery", "run", "--metadata",
                             cluster.metadata_uri, "--id", owner, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


def test_a_worker_killed_mid_ledger_leaves_it_to_another_once_its_session_is_gone(tmp_path: Path,
                                                                                 driver: Driver) -> None:
    _one_driver_unless_slow(driver, "zk")  # the session waits are the daemon's on either driver
    entries = 40000
    value = b"." * 100
    with local_cluster(tmp_path, driver, bookies=4, processes=True) as cluster, \
            client(cluster, add_timeout=30.0) as bk, _metadata(cluster) as (md, ur):
        lh = bk.create_ledger(3, 3, 2, password=b"big")
        for f in [lh.add_entry_async(b"%07d" % e + value) for e in range(entries)]:
            f.result()
        lh.close()
        ensemble = lh.metadata.ensembles[0][1]
        lost = ensemble[0]
        target = next(b for b in cluster.bookie_ids if b not in ensemble)  # the only one outside the ensemble
        _lose(cluster, index_of(cluster, lost))
        doomed = _run_daemon(cluster, "doomed", "--lost-bookie-recovery-delay", "0", "--session-timeout",
                             str(DOOMED_SESSION))
        try:
            def copying() -> bool:
                marker = ur.read(lh.ledger_id)
                return marker is not None and marker.locked_by == "doomed" and \
                    bool(_held(cluster, target, lh.ledger_id, 0, 0))

            _until(copying, 60, "the worker copying the ledger")
        finally:
            doomed.send_signal(signal.SIGKILL)
            out = doomed.communicate(timeout=30)[0].decode(errors="replace")
        killed = time.monotonic()
        held = _held(cluster, target, lh.ledger_id, 0, entries - 1)
        assert 0 < len(held) < entries, (len(held), out)  # killed mid-ledger
        assert _naming(md, lost) == [lh.ledger_id]
        heir = _run_daemon(cluster, "heir")
        try:
            time.sleep(max(0.0, killed + SESSION + 1 - time.monotonic()))  # the heir has looked, more than once
            stuck = ur.read(lh.ledger_id)
            assert stuck is not None and stuck.locked_by == "doomed"  # its session lives on: so does its lock
            _until(_healed(md, ur, lost), 90, "the heir finishing the ledger")
            took = time.monotonic() - killed
        finally:
            heir.send_signal(signal.SIGTERM)
            said = heir.communicate(timeout=60)[0].decode(errors="replace")
        assert heir.returncode == 0 and "heir stopped: 1 ledgers repaired" in said, said
        assert took > DOOMED_SESSION / 2  # not before the dead worker's session ended
        rh = bk.open_ledger(lh.ledger_id, password=b"big")
        assert [e.data for e in rh.read(0, entries - 1)] == [b"%07d" % e + value for e in range(entries)]


# --- what is not (or no longer) to be repaired -----------------------------------------------------------------
def test_a_bookie_back_before_the_delay_is_not_re_replicated(tmp_path: Path, driver: Driver) -> None:
    _one_driver_unless_slow(driver, "local")
    rng = random.Random(19)
    delay = 6
    options = {**DAEMONS, "lost_bookie_recovery_delay": delay}
    with local_cluster(tmp_path, driver, bookies=4, processes=True, bookie_options=options) as cluster, \
            client(cluster) as bk, _metadata(cluster) as (md, ur):
        auditor = _auditor(ur, cluster)
        victim = next(b for b in cluster.bookie_ids if b != auditor)
        data, passwords = _writing_until_named(bk, md, victim, rng)
        before = _ensembles(_all_metadata(cluster.metadata_uri))
        cluster.kill_bookie(index_of(cluster, victim))
        _until(lambda: victim not in _registered(md), SESSION + 5, "the victim unregistered")
        gone = time.monotonic()
        time.sleep(1.5)  # the auditor looks every second: it sees the bookie gone
        assert not ur.ledgers()
        cluster.restart_bookie(index_of(cluster, victim))  # its disks intact
        away = time.monotonic() - gone
        assert away < delay - 1.5, f"the restart took {away:.1f} s: not back before the delay"
        while time.monotonic() - gone < delay + 2:  # a marker would come by now had the return not cancelled it
            assert not ur.ledgers(), "a marker for a bookie that came back"
            time.sleep(0.1)
        log = (cluster.data_dir / f"bookie-{index_of(cluster, auditor)}" / "bookie.log").read_text(errors="replace")
        assert f"auditor: bookie {victim} is back" in log, _logs(cluster)
        assert _ensembles(_all_metadata(cluster.metadata_uri)) == before
        assert ur.auditor() == auditor
        _read_back(bk, data, passwords)


def test_a_ledger_deleted_while_marked_has_its_marker_dropped(tmp_path: Path, driver: Driver,
                                                              caplog: pytest.LogCaptureFixture,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    with local_cluster(tmp_path, driver, bookies=3, processes=True) as cluster, client(cluster) as bk, \
            _metadata(cluster) as (md, ur):
        assert _cli_json(capsys, "disable", "--metadata", cluster.metadata_uri) == {"enabled": False}
        lh = bk.create_ledger(3, 3, 2, password=b"gone")
        lh.add_entry(b"soon deleted")
        lh.close()
        ur.mark(lh.ledger_id, [lh.metadata.ensembles[0][1][0]])
        with caplog.at_level(logging.INFO, logger="walkit.autorecovery"), \
                _daemon(cluster, "dropper", AutoRecoveryConfig(lost_bookie_recovery_delay=NEVER)) as daemon:
            bk.delete_ledger(lh.ledger_id)
            time.sleep(2)  # disabled: the worker leaves the marker alone
            listed = _cli_json(capsys, "list-underreplicated", "--metadata", cluster.metadata_uri)
            assert isinstance(listed, list) and [m["ledger"] for m in listed] == [lh.ledger_id]
            assert daemon.dropped == 0
            assert _cli_json(capsys, "enable", "--metadata", cluster.metadata_uri) == {"enabled": True}
            _until(lambda: not ur.ledgers(), 15, "the marker dropped")
            time.sleep(1.5)  # no second round for a ledger that is gone
        assert (daemon.dropped, daemon.repaired) == (1, 0)  # stopped: counts final
        assert f"ledger {lh.ledger_id} is gone, its marker dropped" in caplog.text
        assert _cli_json(capsys, "list-underreplicated", "--metadata", cluster.metadata_uri) == []
        text = _cli("autorecovery", "list-underreplicated", "--metadata", cluster.metadata_uri)
        assert text.returncode == 0 and "no ledger is under-replicated" in text.stdout


def test_an_open_ledgers_live_fragment_waits_for_its_writer_and_the_ones_behind_it_are_repaired(
        tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=5, processes=True) as cluster, client(cluster) as bk, \
            _metadata(cluster) as (md, ur):
        lh = bk.create_ledger(3, 3, 2, password=b"open")
        for i in range(10):
            lh.add_entry(b"e%d" % i)
        lost = lh.metadata.ensembles[0][1][2]
        _quiet(bk, lost)
        _lose(cluster, index_of(cluster, lost))
        config = AutoRecoveryConfig(lost_bookie_recovery_delay=0, open_ledger_rereplication_grace_period=0.5)
        with _daemon(cluster, "patient", config) as daemon:
            _until(lambda: ur.ledgers() == [lh.ledger_id], SESSION + 10, "the open ledger marked")
            time.sleep(2.5)  # several looks: the marker waits, the only fragment is the writer's
            marker = ur.read(lh.ledger_id)
            assert marker is not None and marker.bookies == {lost} and daemon.repaired == 0
            meta, _ = md.ledgers.read(lh.ledger_id)
            assert meta.state is LedgerState.OPEN and meta.ensembles == lh.metadata.ensembles
            for i in range(10, 20):  # the writer's adds change its ensemble: the lost bookie is behind it
                lh.add_entry(b"e%d" % i)
            assert lost in lh.metadata.ensembles[0][1] and lost not in lh.metadata.ensembles[-1][1]
            _until(_healed(md, ur, lost), 20, "the fragment behind the writer repaired")
            assert daemon.repaired == 1 and md.ledgers.read(lh.ledger_id)[0].state is LedgerState.OPEN
        repaired = md.ledgers.read(lh.ledger_id)[0]
        _readonly(cluster, repaired.ensembles[1][1][0])  # the writer changes its ensemble again, then closes
        for i in range(20, 30):
            lh.add_entry(b"e%d" % i)
        lh.close()
        final = md.ledgers.read(lh.ledger_id)[0]
        assert final.state is LedgerState.CLOSED and len(final.ensembles) == 3
        assert final.ensembles[0] == repaired.ensembles[0]  # the repaired fragment, kept by the writer
        rh = bk.open_ledger(lh.ledger_id, password=b"open")
        assert [e.data for e in rh.read(0, 29)] == [b"e%d" % i for i in range(30)]
        _assert_three_copies(cluster, [final])


# --- the operator's view and switch ---------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["0", "-3", "soon", "inf"])
def test_run_refuses_a_bad_number_of_seconds(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("--session-timeout", "--metadata-retry-deadline", "--open-ledger-grace-period",
                 "--bookie-check-interval"):
        with pytest.raises(SystemExit) as exit_:
            cli_main(["autorecovery", "run", "--metadata", "local:///nowhere", flag, value])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert flag in err and "seconds" in err and repr(value) in err


def test_cli_status_listing_auditor_and_the_off_switch(tmp_path: Path, driver: Driver,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    _one_driver_unless_slow(driver, "zk")
    rng = random.Random(20)
    with local_cluster(tmp_path, driver, bookies=4, processes=True, bookie_options=DAEMONS) as cluster, \
            client(cluster) as bk, _metadata(cluster) as (md, ur):
        uri = cluster.metadata_uri
        auditor = _auditor(ur, cluster)
        assert _cli_json(capsys, "who-is-auditor", "--metadata", uri) == {"auditor": auditor}
        plain = _cli("autorecovery", "who-is-auditor", "--metadata", uri)
        assert plain.returncode == 0 and plain.stdout.strip() == auditor
        idle = {"enabled": True, "auditor": auditor, "underreplicated": 0, "being_repaired": 0}
        assert _cli_json(capsys, "status", "--metadata", uri) == idle
        lost = next(b for b in cluster.bookie_ids if b != auditor)
        data, passwords = _writing_until_named(bk, md, lost, rng)
        assert _cli_json(capsys, "disable", "--metadata", uri) == {"enabled": False}
        assert "autorecovery DISABLED" in _autorecovery(capsys, "status", "--metadata", uri)
        named = _naming(md, lost)
        marked = named[:-1]  # as the auditor had marked them; the last one it has not yet
        for ledger_id in marked:
            ur.mark(ledger_id, [lost])
        _lose(cluster, index_of(cluster, lost))
        _until(lambda: lost not in _registered(md), SESSION + 5, "the lost bookie unregistered")
        time.sleep(3)  # past the delay, several ticks: disabled, nothing is repaired nor marked
        listed = _cli_json(capsys, "list-underreplicated", "--metadata", uri)
        assert isinstance(listed, list)
        assert [(m["ledger"], m["bookies"], m["locked_by"]) for m in listed] == [(lid, [lost], None) for lid in marked]
        assert _naming(md, lost) == named
        assert _cli_json(capsys, "status", "--metadata", uri) == {**idle, "enabled": False,
                                                                  "underreplicated": len(marked)}
        assert _cli_json(capsys, "enable", "--metadata", uri) == {"enabled": True}
        _until(_healed(md, ur, lost), 60, "repairs resumed", cluster)
        assert _cli_json(capsys, "status", "--metadata", uri) == idle
        _read_back(bk, data, passwords)


# --- the periodic check of every copy --------------------------------------------------------------------------
def test_the_periodic_check_finds_a_missing_copy_and_a_worker_fills_it_in_place(
        tmp_path: Path, driver: Driver, caplog: pytest.LogCaptureFixture) -> None:
    """A writer's last entry reached Qa=2 of its write set of three, the third copy never
    arrived, and the ledger was closed at that entry: written here as the client would,
    with the third copy of the last entry left out (support.client.raw_add), its metadata
    created and closed directly."""
    with local_cluster(tmp_path, driver, bookies=3, processes=True) as cluster, client(cluster) as bk, \
            _metadata(cluster) as (md, ur):
        ensemble = tuple(cluster.bookie_ids)
        meta = LedgerMetadata.create(md.ledgers.new_ledger_id(), ensemble, write_quorum=3, ack_quorum=2,
                                     password=b"gap", ctime=int(time.time() * 1000))
        md.ledgers.create(meta)
        values = [b"value-%d" % e for e in range(11)]
        length = 0
        for e, value in enumerate(values):
            length += len(value)
            raw_add(cluster, meta, e, value, e - 1, length, list(ensemble if e < 10 else ensemble[:2]),
                    password=b"gap")
        md.ledgers.update(meta.ledger_id, lambda m: m.closed(10, length))
        lacking = ensemble[2]
        assert _held(cluster, lacking, meta.ledger_id, 0, 10) == set(range(10))
        config = AutoRecoveryConfig(lost_bookie_recovery_delay=NEVER, auditor_periodic_check_interval=2.0)
        with caplog.at_level(logging.INFO, logger="walkit.autorecovery"), \
                _daemon(cluster, "checker", config) as daemon:
            _until(lambda: daemon.repaired >= 1 and not ur.ledgers(), 20, "the gap found and filled")
        assert daemon.marked >= 1  # (a check running while the marker waits merges into it)
        assert f"ledger {meta.ledger_id} repaired ({lacking})" in caplog.text
        assert _held(cluster, lacking, meta.ledger_id, 0, 10) == set(range(11))
        after, _ = md.ledgers.read(meta.ledger_id)
        assert after.ensembles == ((0, ensemble),)  # filled in place: no ensemble changed
        rh = bk.open_ledger(meta.ledger_id, password=b"gap")
        assert [e.data for e in rh.read(0, 10)] == values
