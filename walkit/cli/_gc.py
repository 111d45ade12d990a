"""``walkit bookie gc``: force garbage collection on bookies, or report it.

The bookies are found through their registration (every registered one, writable or
read-only, or the one ``--bookie`` names) and asked over the wire protocol (ADMIN
requests ``gc.run`` and ``gc.status``, :mod:`walkit.protocol._admin`). ``--force`` asks
each bookie for a pass now and waits until that pass has ended (``--timeout``), polling
its status; ``--status`` (the default) prints what each last did. A bookie that cannot
be reached is reported and makes the exit status 1; the others are still served.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

from walkit.cli._commands import Subcommands
from walkit.cli._metadata import add_metadata_option
from walkit.cli._output import size
from walkit.errors import BookieTimeoutError, BookieUnavailableError, InvalidArgumentError, WalkitError

if TYPE_CHECKING:
    from walkit.metadata import ClusterFormat

__all__ = ["add_parser"]

_POLL = 0.2  # seconds between status polls while a forced pass runs
_CALL_TIMEOUT = 20.0  # seconds one request may take: a hung bookie (SIGSTOP, swapping) is reported


def add_parser(bookie: Subcommands) -> None:
    p = bookie.add_parser("gc", help="force garbage collection and compaction on bookies, or show its status")
    add_metadata_option(p)
    p.add_argument("--bookie", help="only this bookie (its id); default: every registered bookie")
    p.add_argument("--force", action="store_true", help="run a GC pass now and wait for it to end")
    p.add_argument("--compact", choices=("minor", "major"), help="with the pass, compact entry logs (implies --force)")
    p.add_argument("--status", action="store_true", help="show each bookie's GC status (the default)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for a forced pass (default 600)")
    p.add_argument("--tls-ca", default="", help="CA file, for bookies that serve TLS")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise InvalidArgumentError("--timeout must be positive", timeout=args.timeout)
    force = bool(args.force or args.compact)
    targets = _targets(args.metadata, args.bookie)
    results = asyncio.run(_ask_all(targets, force, args.compact, args.timeout, args.tls_ca))
    if args.json:
        print(json.dumps(results, indent=2, sort_keys=True))
    else:
        for bookie_id, result in results.items():
            print(_human(bookie_id, result, force))
    return 1 if any("error" in r and len(r) == 1 for r in results.values()) else 0


_Target = tuple[bytes | None, str, "ClusterFormat"]


def _targets(uri: str, only: str | None) -> dict[str, _Target]:
    """``bookie id -> (registration, "writable" | "readonly", cluster format)`` of the bookies to ask."""
    from walkit.metadata import connect, read_registration

    with connect(uri, read_only=True) as cluster:  # a forced pass is asked of the bookies, not metadata
        bookies = cluster.bookies()
        states = {b: "writable" for b in bookies.writable} | {b: "readonly" for b in bookies.readonly}
        if only is not None:
            if only not in states:
                raise BookieUnavailableError("bookie is not registered", bookie=only, metadata=uri)
            states = {only: states[only]}
        if not states:
            raise BookieUnavailableError("no bookie is registered", metadata=uri)
        return {b: (read_registration(cluster.store, cluster.info, b), state, cluster.info.format)
                for b, state in sorted(states.items())}


async def _ask_all(targets: dict[str, _Target], force: bool, compact: str | None,
                   timeout: float, tls_ca: str) -> dict[str, dict[str, Any]]:
    answers = await asyncio.gather(*(_ask(b, reg, fmt, force, compact, timeout, tls_ca)
                                     for b, (reg, _, fmt) in targets.items()), return_exceptions=True)
    results: dict[str, dict[str, Any]] = {}
    for (bookie_id, (_, state, _)), answer in zip(targets.items(), answers):
        if isinstance(answer, WalkitError):
            results[bookie_id] = {"error": str(answer)}
        elif isinstance(answer, BaseException):
            raise answer
        else:
            results[bookie_id] = {**answer, "registered": state}
    return results


async def _ask(bookie_id: str, registration: bytes | None, cluster_format: ClusterFormat, force: bool,
               compact: str | None, timeout: float, tls_ca: str) -> dict[str, Any]:
    from walkit.client import BookieClient, client_ssl_context, parse_endpoint

    endpoint = parse_endpoint(bookie_id, registration, cluster_format)
    if endpoint.kind != "walkit":
        raise BookieUnavailableError("an Apache BookKeeper bookie: it has no walkit GC commands", bookie=bookie_id)
    if endpoint.tls and not tls_ca:
        raise BookieUnavailableError("bookie serves TLS: give --tls-ca", bookie=bookie_id)
    ssl_context = client_ssl_context(tls_ca) if endpoint.tls else None
    async with await BookieClient.connect(endpoint.host, endpoint.port, ssl_context=ssl_context,
                                          server_hostname=endpoint.host, timeout=_CALL_TIMEOUT) as client:
        if not force:
            status: dict[str, Any] = await _call(client, bookie_id, "gc.status")
            return status
        number = (await _call(client, bookie_id, "gc.run", {"compact": compact}))["pass"]
        deadline = time.monotonic() + timeout
        while True:
            status = await _call(client, bookie_id, "gc.status")
            if status["passes"] >= number:
                return status
            if time.monotonic() >= deadline:
                raise BookieUnavailableError("the forced GC pass did not end in time (it goes on)", bookie=bookie_id,
                                             timeout=timeout, passes=status["passes"], waiting_for=number)
            await asyncio.sleep(_POLL)


async def _call(client: Any, bookie_id: str, command: str, args: dict[str, Any] | None = None) -> Any:
    try:
        return await asyncio.wait_for(client.admin(command, args), _CALL_TIMEOUT)
    except asyncio.TimeoutError as exc:
        raise BookieTimeoutError("the bookie did not answer", bookie=bookie_id, command=command,
                                 timeout=_CALL_TIMEOUT) from exc


def _pass_line(p: dict[str, Any]) -> str:
    return (f"{p['ledgers_removed']} ledgers removed (+{p['overreplicated_removed']} over-replicated), "
            f"{p['entry_logs_deleted']} entry logs deleted, {p['entry_logs_compacted']} compacted "
            f"({p['entries_copied']} entries, {size(p['bytes_copied'])} copied), "
            f"{size(p['bytes_reclaimed'])} reclaimed")


def _human(bookie_id: str, r: dict[str, Any], forced: bool) -> str:
    if "passes" not in r:
        return f"bookie {bookie_id}: {r.get('error', 'no answer')}"
    lines = [f"bookie {bookie_id} ({r['registered']}{', read-only' if r.get('readonly') else ''})"]
    last = r["last_pass"]
    if last is None:
        lines.append("  last pass      none yet")
    else:
        how = " (forced)" if last["forced"] else ""
        lines.append(f"  last pass      #{last['number']}{how} at {last['started']}, {last['seconds']:.2f} s: "
                     + _pass_line(last))
        lines += [f"  cut short      {reason}" for reason in last["cut_short"]]
        if last["error"]:
            lines.append(f"  failed         {last['error']}")
    unavailable = r.get("metadata_unavailable_passes", 0)  # an older bookie does not say
    lines.append(f"  totals         {r['passes']} passes"
                 + (f" ({unavailable} stopped short: metadata unavailable)" if unavailable else "")
                 + f": {_pass_line(r['totals'])}")
    lc = r["last_compaction"]
    lines.append(f"  compaction     {r['compaction']} (last minor: {lc['minor'] or 'never'}, "
                 f"last major: {lc['major'] or 'never'})")
    logs = r["entry_logs"]
    live = "-" if logs["live_fraction"] is None else f"{logs['live_fraction']:.1%} live"
    lines.append(f"  entry logs     {logs['count']} sealed, {size(logs['total_bytes'])}, {live}"
                 + (f", {logs['compacting']} being compacted" if logs["compacting"] else ""))
    if r["damaged_entry_logs"]:
        lines.append(f"  damaged logs   {', '.join(r['damaged_entry_logs'])} (never removed; see the bookie's log)")
    lines.append(f"  disk           {r['disk_usage']:.1%} used; next pass in {r['next_pass_in_seconds']:.0f} s"
                 + ("" if r["metadata"] else "; no metadata: deleted ledgers are not collected"))
    return "\n".join(lines)
