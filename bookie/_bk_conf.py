"""A walkit bookie started from BookKeeper's ``bk_server.conf`` (Java properties).

Every key of the file (read by :mod:`bookie._properties`, Commons Configuration's way) is
one of four kinds, the table in docs/operations.md ("Starting from bk_server.conf"):

- honoured: a :class:`~bookie._config.BookieConfig` key, its text converted to the field's
  type (ints and floats as Java parses them, booleans ``true``/``false`` in any case, lists
  split at commas). An empty value leaves the default, as an unset key.
- mapped: BookKeeper keys walkit covers under another name (:data:`MAPPED`):
  ``journalDirectories`` (one directory: walkit writes one journal), ``httpServerHost``,
  ``zkServers`` + ``zkLedgersRootPath`` (used when ``metadataServiceUri`` is not given),
  and ``metadataServiceUri`` whose hosts BookKeeper separates with ``;``.
- refused: a value walkit cannot honour (:data:`REFUSED`: another ledger storage, a
  BookKeeper on-disk format version to write; a TLS store type other than PEM for a store
  that is given, :data:`PEM_ONLY`), a value of the wrong type, or a list where one value
  is expected: ConfigError naming the key, the value and why.
- ignored: any other key (JVM, Netty, stats provider, table service ...): listed, all of
  them, in one warning at start, not refused.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import tomllib
from typing import Any

from bookie._config import BookieConfig, os_reason
from bookie._properties import decode, load_configuration
from walkit.errors import ConfigError

__all__ = ["MAPPED", "PEM_ONLY", "REFUSED", "from_properties", "load", "load_config", "read_properties", "warn_ignored"]

log = logging.getLogger("bookie")

#: BookKeeper keys walkit reads under another name, and what it does with them.
MAPPED = {
    "journalDirectories": "journalDirectory, which it overrides (one directory; walkit writes one journal)",
    "httpServerHost": "httpServerAddress",
    "zkServers": "metadataServiceUri zk://<zkServers><zkLedgersRootPath>, when metadataServiceUri is not given",
    "zkLedgersRootPath": "the path of the zk:// metadataServiceUri built from zkServers (default /ledgers)",
}
#: Keys whose every value walkit refuses, and why.
REFUSED = {
    "ledgerStorageClass": "walkit has its own ledger storage (entry logs, index files, a write cache); "
                          "remove the key",
    "journalFormatVersionToWrite": "walkit writes its own journal format (docs/format.md), not BookKeeper's; "
                                   "remove the key",
    "fileInfoFormatVersionToWrite": "walkit writes its own index files (docs/format.md), not BookKeeper's; "
                                    "remove the key",
    "sortedLedgerStorageEnabled": "walkit has its own ledger storage; remove the key",
}
#: TLS store types, and the store each describes: walkit reads PEM files only, so another
#: type (BookKeeper's default is JKS) is refused when its store is given (else ignored).
PEM_ONLY = {"tlsKeyStoreType": "tlsKeyStore", "tlsTrustStoreType": "tlsTrustStore"}
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?")


def _refuse(key: str, value: str, why: str) -> ConfigError:
    return ConfigError(f"{key} = {value!r}: {why}", key=key, value=value)


def _one(key: str, values: list[str]) -> str:
    if len(values) != 1:
        raise _refuse(key, ",".join(values), "one value expected, not a list (a comma, or the key given twice)")
    return values[0]


def _convert(key: str, kind: str, values: list[str]) -> Any:
    """The field's value from its elements (None: empty, the default stays)."""
    if kind == "list[str]":
        items = [v for v in values if v]
        return items or None
    text = _one(key, values)
    if not text:
        return None
    if kind == "str":
        return text
    if kind == "bool":
        if text.lower() not in ("true", "false"):
            raise _refuse(key, text, "not a boolean (true or false)")
        return text.lower() == "true"
    if kind == "int":
        if not _INT.fullmatch(text):
            raise _refuse(key, text, "not an integer")
        return int(text)
    if not _FLOAT.fullmatch(text):
        raise _refuse(key, text, "not a number")
    return float(text.rstrip("fFdD"))


def _metadata_uri(conf: dict[str, list[str]]) -> str | None:
    """metadataServiceUri (``;`` between hosts, as BookKeeper writes them, becomes ``,``),
    else zk:// from zkServers and zkLedgersRootPath, else None."""
    if conf.get("metadataServiceUri", [""]) != [""]:
        return _one("metadataServiceUri", conf["metadataServiceUri"]).replace(";", ",")
    servers = [s for s in conf.get("zkServers", []) if s]
    if not servers:
        return None
    root = _one("zkLedgersRootPath", conf.get("zkLedgersRootPath", ["/ledgers"])) or "/ledgers"
    return f"zk://{','.join(servers)}{root}"


def _journal_directory(conf: dict[str, list[str]]) -> str | None:
    """journalDirectories (BookKeeper prefers it to journalDirectory): one directory."""
    dirs = [d for d in conf.get("journalDirectories", []) if d]
    if not dirs:
        return None
    if len(dirs) > 1:
        raise _refuse("journalDirectories", ",".join(dirs), "walkit writes one journal per bookie: give one "
                      "directory")
    return dirs[0]


def load_config(conf: dict[str, list[str]]) -> tuple[BookieConfig, list[str]]:
    """The configuration from a read ``bk_server.conf`` and the keys it ignores (sorted)."""
    fields = {f.metadata["key"]: f for f in dataclasses.fields(BookieConfig)}
    for key, why in REFUSED.items():
        if key in conf and conf[key] != [""]:
            raise _refuse(key, ",".join(conf[key]), why)
    for key, store in PEM_ONLY.items():
        kind = ",".join(conf.get(key, [""]))
        if kind and kind.upper() != "PEM" and any(conf.get(store, [""])):
            raise _refuse(key, kind, f"walkit bookies read PEM files only: give {store} as PEM and set {key}=PEM")
    values: dict[str, Any] = {}
    for key, elements in conf.items():
        f = fields.get(key)
        if f is not None:
            value = _convert(key, str(f.type), elements)
            if value is not None:
                values[key] = value
    uri = _metadata_uri(conf)
    if uri is not None:
        values["metadataServiceUri"] = uri
    journal = _journal_directory(conf)
    if journal is not None:  # BookKeeper: "If journalDirectories is set, bookies will skip journalDirectory"
        values["journalDirectory"] = journal
    host = _convert("httpServerHost", "str", conf["httpServerHost"]) if "httpServerHost" in conf else None
    if host is not None:
        values.setdefault("httpServerAddress", host)
    ignored = sorted(set(conf) - set(fields) - set(MAPPED))
    return BookieConfig.from_dict(values), ignored


def read_properties(path: str) -> tuple[BookieConfig, list[str]]:
    """``load_config`` of the properties file ``path``."""
    return load_config(load_configuration(decode(_read(path))))


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise ConfigError(f"cannot read configuration: {os_reason(exc)}", path=path) from exc


def load(path: str) -> BookieConfig:
    """The configuration in ``path``: ``*.toml`` is TOML; ``*.conf`` and ``*.properties``
    are Java properties (``bk_server.conf``); any other name is TOML if it parses as TOML,
    else properties naming at least one key walkit knows, else a ConfigError giving both
    reasons. The keys of a properties file walkit ignores are logged in one warning."""
    lower = path.lower()
    if lower.endswith(".toml"):
        return BookieConfig.from_toml(path)
    if not lower.endswith((".conf", ".properties")):
        data = _read(path)
        try:
            tomllib.loads(decode(data))
        except tomllib.TOMLDecodeError as exc:
            conf = load_configuration(decode(data))
            if not set(conf) & (set(BookieConfig.keys()) | set(MAPPED) | set(REFUSED)):
                raise ConfigError("cannot read configuration: neither TOML (" + str(exc) + ") nor Java "
                                  "properties naming a bookie key", path=path) from exc
        else:
            return BookieConfig.from_toml(path)
    return from_properties(path)


def from_properties(path: str) -> BookieConfig:
    """The configuration in BookKeeper's Java properties ``bk_server.conf`` at ``path``;
    the keys walkit ignores are logged in one warning."""
    config, ignored = read_properties(path)
    warn_ignored(path, ignored)
    return config


def warn_ignored(path: str, ignored: list[str]) -> None:
    """One warning naming every key of ``path`` walkit ignores (none: no warning)."""
    if ignored:
        log.warning("%d keys of %s are not implemented by walkit and are ignored: %s", len(ignored), path,
                    ", ".join(ignored))
