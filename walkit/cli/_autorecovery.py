"""``walkit autorecovery status|list-underreplicated|who-is-auditor|disable|enable|run``
(:mod:`walkit.recovery._autorecovery`)."""

from __future__ import annotations

import argparse
import json
import signal
import threading
from datetime import datetime, timezone
from typing import Any

from walkit.cli._commands import Subcommands
from walkit.cli._metadata import add_metadata_option

__all__ = ["register"]


def register(subparsers: Subcommands) -> None:
    ar = subparsers.add_parser("autorecovery", help="the auditor and replication workers: inspect, switch, run")
    verbs = subparsers.subcommands(ar, dest="verb")
    for name, help_text in (("status", "enabled or not, the auditor, how many ledgers are under-replicated"),
                            ("list-underreplicated", "every ledger marked under-replicated"),
                            ("who-is-auditor", "the daemon holding the auditor's seat"),
                            ("disable", "idle every auditor and worker"),
                            ("enable", "let them work again")):
        v = verbs.add_parser(name, help=help_text)
        add_metadata_option(v)
        v.add_argument("--json", action="store_true", help="machine-readable output")
        v.set_defaults(func=_inspect)
    run = verbs.add_parser("run", help="run a standalone autorecovery daemon until SIGINT/SIGTERM")
    add_metadata_option(run)
    run.add_argument("--id", default="", help="this daemon's name (default: autorecovery-<pid>)")
    run.add_argument("--lost-bookie-recovery-delay", type=float, default=0.0,
                     help="seconds a bookie must stay away before it is re-replicated (lostBookieRecoveryDelay)")
    run.add_argument("--periodic-check-interval", type=float, default=604800.0,
                     help="seconds between checks of every copy (auditorPeriodicCheckInterval; 0: off)")
    run.add_argument("--bookie-check-interval", type=_seconds, default=86400.0,
                     help="seconds between audits of every ledger's bookies (auditorPeriodicBookieCheckInterval)")
    run.add_argument("--open-ledger-grace-period", type=_seconds, default=30.0,
                     help="seconds between looks at an open ledger whose writer holds a lost bookie "
                          "(openLedgerRereplicationGracePeriod)")
    run.add_argument("--session-timeout", type=_seconds, default=10.0,
                     help="the daemon's metadata session timeout: how soon another takes over its seat and "
                          "locks once it dies (zkTimeout)")
    run.add_argument("--metadata-retry-deadline", type=_seconds, default=30.0,
                     help="seconds a metadata call waits for an unreachable ZooKeeper or a locked local:// store "
                          "before it fails and is tried again later (metadataRetryDeadlineMs)")
    run.add_argument("--tls-ca", default="", help="CA file, for bookies that serve TLS")
    run.set_defaults(func=_run)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {text!r}")
    return value


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds")


def _inspect(args: argparse.Namespace) -> int:
    from walkit.metadata import connect
    from walkit.metadata import UnderReplication

    with connect(args.metadata, read_only=args.verb not in ("disable", "enable")) as cluster:
        ur = UnderReplication(cluster.store, cluster.info)
        if args.verb in ("disable", "enable"):
            ur.set_disabled(args.verb == "disable")
            result: Any = {"enabled": not ur.disabled()}
        elif args.verb == "who-is-auditor":
            result = {"auditor": ur.auditor()}
        else:
            markers = [m for m in (ur.read(lid) for lid in ur.ledgers()) if m is not None]
            if args.verb == "status":
                result = {"enabled": not ur.disabled(), "auditor": ur.auditor(), "underreplicated": len(markers),
                          "being_repaired": sum(1 for m in markers if m.locked_by)}
            else:
                result = [{"ledger": m.ledger_id, "bookies": sorted(m.bookies), "since": _iso(m.since),
                           "locked_by": m.locked_by} for m in markers]
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    elif args.verb == "list-underreplicated":
        for m in result:
            print(f"ledger {m['ledger']}\tmissing {','.join(m['bookies'])}\tsince {m['since']}"
                  + (f"\tbeing repaired by {m['locked_by']}" if m["locked_by"] else ""))
        if not result:
            print("no ledger is under-replicated")
    elif args.verb == "who-is-auditor":
        print(result["auditor"] or "no auditor (no autorecovery daemon is running)")
    elif args.verb == "status":
        print(f"autorecovery {'enabled' if result['enabled'] else 'DISABLED'}; auditor: "
              f"{result['auditor'] or 'none'}; {result['underreplicated']} ledgers under-replicated "
              f"({result['being_repaired']} being repaired)")
    else:
        print(f"autorecovery {'enabled' if result['enabled'] else 'disabled'}")
    return 0


def _run(args: argparse.Namespace) -> int:
    import os

    from walkit.recovery import AutoRecovery, AutoRecoveryConfig

    config = AutoRecoveryConfig(lost_bookie_recovery_delay=args.lost_bookie_recovery_delay,
                                auditor_periodic_check_interval=args.periodic_check_interval,
                                auditor_periodic_bookie_check_interval=args.bookie_check_interval,
                                open_ledger_rereplication_grace_period=args.open_ledger_grace_period)
    daemon = AutoRecovery(args.metadata, args.id or f"autorecovery-{os.getpid()}", config,
                          session_timeout=args.session_timeout, retry_deadline=args.metadata_retry_deadline,
                          tls_ca=args.tls_ca)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    daemon.start()
    print(f"autorecovery {daemon.owner} running", flush=True)
    while not stop.wait(0.5):
        if daemon.error is not None:
            break
    daemon.stop()
    if daemon.error is not None:
        raise daemon.error
    print(f"autorecovery {daemon.owner} stopped: {daemon.repaired} ledgers repaired, {daemon.marked} marked", flush=True)
    return 0
