"""Log records that say what they are about, and the two ways walkit prints them.

Theory of operation
-------------------
A walkit log call names its subject in the record itself, not only in the message:
``log.warning("...", ..., extra=context(ledger=7, bookie="10.0.0.5:3181"))`` sets the
record attributes ``ledger`` and ``bookie``. The keys are few and fixed
(:data:`CONTEXT_KEYS`), so an application's own handlers and formatters (a JSON
formatter, a log shipper) find them as plain attributes of every record, whatever the
message's wording. walkit prints them with one of two formatters: :class:`ContextFormatter`
(a line of text, the context appended as ``[ledger=7 bookie=...]``) or
:class:`JsonFormatter` (one JSON object per line: time, level, logger, message, the
context fields, the traceback if any). :func:`configure` installs either on stderr; the
``walkit`` command (``--log-format``) and ``python -m bookie`` use it.

It also holds the loggers of libraries that repeat themselves (:data:`QUIET_LIBRARIES`:
kazoo logs every reconnect attempt, a dozen lines before walkit's one error when
ZooKeeper cannot be reached) at ERROR, unless a level more verbose than the command's
default was asked for (``-v`` for ``walkit``, whose default is WARNING; ``-vv`` or
``--log-level DEBUG`` for a bookie, which logs INFO by default).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import IO, Any

__all__ = ["CONTEXT_KEYS", "QUIET_LIBRARIES", "context", "ContextFormatter", "JsonFormatter", "configure"]

#: What a record may be about: a bookie (its id), a ledger, an entry, a write-ahead log
#: (its name) and namespace, a journal file (its id), a ledger directory, an
#: autorecovery daemon (its owner).
CONTEXT_KEYS: tuple[str, ...] = ("bookie", "ledger", "entry", "log", "namespace", "journal", "directory", "daemon")
_KEYS = frozenset(CONTEXT_KEYS)
#: Loggers held at ERROR unless more than a command's default level is asked for.
QUIET_LIBRARIES: tuple[str, ...] = ("kazoo",)


def context(**fields: Any) -> dict[str, Any]:
    """``extra=`` for a log call: the given context fields (None values left out)."""
    unknown = set(fields) - _KEYS
    if unknown:
        raise ValueError(f"not a log context key: {', '.join(sorted(unknown))} (known: {', '.join(CONTEXT_KEYS)})")
    return {k: v for k, v in fields.items() if v is not None}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: record.__dict__[k] for k in CONTEXT_KEYS if k in record.__dict__}


class ContextFormatter(logging.Formatter):
    """The standard text format, with the record's context appended: ``[ledger=7 ...]``."""

    def __init__(self, fmt: str = "%(asctime)s %(levelname)s %(name)s: %(message)s") -> None:
        super().__init__(fmt)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        text = super().formatMessage(record)
        fields = _fields(record)
        if fields:
            text += " [" + " ".join(f"{k}={v}" for k, v in fields.items()) + "]"
        return text


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (ISO 8601, UTC, ms), ``level``, ``logger``,
    ``message``, the context fields, and ``exception`` (the traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in _fields(record).items():
            out[key] = value if isinstance(value, (int, float, str, bool)) else str(value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        return json.dumps(out, ensure_ascii=False)


def configure(level: int = logging.WARNING, fmt: str = "text", stream: IO[str] | None = None, *,
              force: bool = False, default: int = logging.WARNING) -> bool:
    """Log to ``stream`` (stderr) at ``level`` in format ``text`` or ``json``;
    :data:`QUIET_LIBRARIES` only at ERROR unless ``level`` is more verbose than the
    command's ``default``. Like :func:`logging.basicConfig`, it leaves a root logger that
    has handlers already alone (the program embedding walkit, or a test runner, owns
    logging) unless ``force``; True when it configured."""
    if fmt not in ("text", "json"):
        raise ValueError(f"log format must be text or json, not {fmt!r}")
    root = logging.getLogger()
    if root.handlers and not force:
        return False
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else ContextFormatter())
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in QUIET_LIBRARIES:  # NOTSET: as verbose as the root
        logging.getLogger(name).setLevel(logging.NOTSET if level < default else logging.ERROR)
    return True
