"""What the inspection commands share: printing records and payloads, streamed JSON,
sizes and times, and asking before a change."""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from typing import Any

from walkit.errors import UsageError

__all__ = ["FORMATS", "FORMAT_HELP", "add_format", "record_line", "payload_json", "stream_json", "confirm", "iso_ms",
           "size", "text_or_escaped", "ledger_id", "limited"]

FORMATS = ("text", "raw", "hex", "json")
FORMAT_HELP = ("how records print: text (default: the record as text when it is printable UTF-8, else as escaped "
               "bytes like \\x00), raw (the record's bytes only, each followed by a newline), hex, json (one object "
               "per line: the position and the record as \"text\" when it is valid UTF-8, else as \"base64\")")


def add_format(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=FORMATS, default="text", help=FORMAT_HELP)
    p.add_argument("--json", action="store_true", help="the same as --format json")


def ledger_id(text: str) -> int:
    """argparse type: a ledger id (decimal, 0 .. 2^63 - 1)."""
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a ledger id: {text!r}") from None
    if not 0 <= value < 1 << 63:
        raise argparse.ArgumentTypeError(f"ledger id out of range: {text!r}")
    return value


def text_or_escaped(data: bytes) -> str:
    """The bytes as text when they are printable UTF-8, else escaped (``\\x00``, ``\\n``)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return repr(data)[2:-1]
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def payload_json(data: bytes) -> dict[str, str]:
    """``{"text": ...}`` for valid UTF-8, else ``{"base64": ...}``."""
    try:
        return {"text": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def record_line(fmt: str, key: str, position: str, data: bytes) -> None:
    """Print one record (``key`` names its position in JSON: ``lsn``, ``entry``)."""
    out = sys.stdout
    if fmt == "raw":
        out.flush()
        out.buffer.write(data + b"\n")
        out.buffer.flush()
    elif fmt == "hex":
        out.write(f"{position}\t{data.hex()}\n")
    elif fmt == "json":
        value: Any = int(position) if key == "entry" else position
        out.write(json.dumps({key: value, **payload_json(data)}) + "\n")
    else:
        out.write(f"{position}\t{text_or_escaped(data)}\n")


def stream_json(items: Iterable[Any]) -> int:
    """Print a JSON array item by item (never all in memory); how many there were."""
    count = 0
    sys.stdout.write("[")
    for item in items:
        sys.stdout.write(("," if count else "") + "\n  " + json.dumps(item, sort_keys=True))
        count += 1
    sys.stdout.write("\n]\n" if count else "]\n")
    return count


def limited(items: Iterable[Any], limit: int | None) -> Iterator[Any]:
    for n, item in enumerate(items):
        if limit is not None and n >= limit:
            return
        yield item


def confirm(question: str, yes: bool) -> bool:
    """True with ``--yes``; else ask on the terminal. Refuses (UsageError) when stdin is
    not a terminal, rather than wait for an answer that cannot come."""
    if yes:
        return True
    if not sys.stdin.isatty():
        raise UsageError(f"{question}: not confirmed (stdin is not a terminal); pass --yes to do it anyway")
    answer = input(f"{question} [y/N] ").strip().lower()
    return answer in ("y", "yes")


def iso_ms(millis: int) -> str:
    return datetime.fromtimestamp(millis / 1000, timezone.utc).isoformat(timespec="milliseconds")


def size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
