"""Where Apache BookKeeper 4.18 keeps things in ZooKeeper: pure path arithmetic, no I/O.

Theory of operation
-------------------
BookKeeper's ledger managers name a ledger's metadata znode after its id
(docs/format.md, "BookKeeper metadata formats"):

* ``flat`` (FlatLedgerManagerFactory): ``<root>/L%010d``;
* ``hierarchical`` (HierarchicalLedgerManagerFactory, the default, a hybrid): ids below
  ``Integer.MAX_VALUE`` (2^31 - 1) split their 10-digit form 2/4/L4
  (``<root>/00/0000/L0007``), larger ids their 19-digit form 3/4/4/4/L4;
* ``longhierarchical`` (LongHierarchicalLedgerManagerFactory): every id the 19-digit
  3/4/4/4/L4 split (``<root>/000/0000/0000/0000/L0007``).

The first two are walkit's own layouts (``_paths``), reused here; this module adds the
long-only one, the parse of all three (exact: a path is a ledger path only if the
encoder would have produced it) and the ordered listing of all three
(:func:`iter_ledger_ids`, :func:`iter_ledger_ranges`: the long-only walk lists one
directory at a time, 3-digit top directories only, as BookKeeper's
``LongHierarchicalLedgerManager`` does, so any other child of the root - the special
nodes, walkit's ``ID-walkit`` - is never entered).

Ledger ids come from ZooKeeper sequential nodes. The 31-bit generator (``idgen``, or the
root itself for ``flat``) creates ``<prefix>ID-`` EPHEMERAL_SEQUENTIAL, takes the id from
the 10-digit counter ZooKeeper appends, and deletes the node; a counter at or past
``Integer.MAX_VALUE`` (or wrapped negative) is an overflow. Past it the hierarchical
manager moves to ``idgen-long``: ``HOB-%010d`` directories hold the high 32 bits, the
counter of the ``ID-`` nodes below one the low 31, and the id is ``(high << 32) | low``.

Under-replication marks live at ``<root>/underreplication/ledgers/`` + four 16-bit hex
directories of the id + ``urL%010d``; their locks at ``<root>/underreplication/locks/``
``urL%010d``; the auditor election at ``<root>/underreplication/auditorelection`` with
``V_<counter>`` votes (the lowest counter is the auditor).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Literal

from walkit.errors import FormatError, InvalidArgumentError
from walkit.metadata import _paths

__all__ = [
    "Manager", "MANAGERS", "INT_MAX", "ledger_path", "parse_ledger_path", "idgen_prefix", "id_from_idgen",
    "long_idgen_prefix", "long_id_from_idgen", "split_long_id", "hob_name", "parse_hob", "ur_path",
    "parse_ur_path", "ur_lock_path", "election_path", "vote_sequence", "iter_ledger_ids", "iter_ledger_ranges",
]

Manager = Literal["flat", "hierarchical", "longhierarchical"]
MANAGERS: tuple[Manager, ...] = ("flat", "hierarchical", "longhierarchical")
INT_MAX = (1 << 31) - 1  # Integer.MAX_VALUE: the 31-bit generator's limit (exclusive)
MAX_LEDGER_ID = (1 << 63) - 1
_LONG_SPLIT = (3, 4, 4, 4, 4)
_SEQUENCE = re.compile(r"-?[0-9]{10}")
_HOB = re.compile(r"HOB-([0-9]{10})")
_VOTE = re.compile(r"V_([0-9]+)")
_UR_LEAF = re.compile(r"urL([0-9]{10,})")


def _check_manager(manager: str) -> None:
    if manager not in MANAGERS:
        raise InvalidArgumentError("unknown BookKeeper ledger manager", manager=manager, known=",".join(MANAGERS))


def _check_id(ledger_id: int) -> None:
    if isinstance(ledger_id, bool) or not isinstance(ledger_id, int) or not 0 <= ledger_id <= MAX_LEDGER_ID:
        raise InvalidArgumentError("ledger id out of range", ledger=ledger_id)


def _base(root: str) -> str:
    return "" if root == "/" else root


def ledger_path(root: str, ledger_id: int, manager: Manager = "hierarchical") -> str:
    """The znode of ``ledger_id``'s metadata under ``root`` for ``manager``."""
    _check_manager(manager)
    if manager != "longhierarchical":
        return _paths.ledger_path(root, ledger_id, manager)
    _check_id(ledger_id)
    _paths.ledger_path(root, 0)  # checks root
    digits, parts, at = f"{ledger_id:019d}", [], 0
    for size in _LONG_SPLIT:
        parts.append(digits[at:at + size])
        at += size
    return f"{_base(root)}/{'/'.join(parts[:-1])}/L{parts[-1]}"


def parse_ledger_path(root: str, path: str, manager: Manager = "hierarchical") -> int | None:
    """The ledger id whose ``manager`` path is exactly ``path``, or None."""
    _check_manager(manager)
    if manager != "longhierarchical":
        return _paths.parse_ledger_path(root, path, manager)
    prefix = _base(root) + "/"
    rest = path[len(prefix):] if path.startswith(prefix) else ""
    digits = rest.replace("/", "").replace("L", "", 1)
    if len(digits) != 19 or not digits.isascii() or not digits.isdigit():
        return None
    ledger_id = int(digits)
    if ledger_id > MAX_LEDGER_ID or ledger_path(root, ledger_id, manager) != path:
        return None
    return ledger_id


Children = Callable[[str], list[str]]
Range = tuple[int, int, list[int]]


def _names(children: Children, path: str, width: int) -> list[str]:
    return sorted(n for n in children(path) if len(n) == width and n.isascii() and n.isdigit())


def _long_ranges(children: Children, path: str, split: tuple[int, ...], digits: str) -> Iterator[Range]:
    """The long-only tree below ``path`` (whose id digits so far are ``digits``)."""
    if len(split) > 1:
        for name in _names(children, path, split[0]):
            yield from _long_ranges(children, f"{path}/{name}", split[1:], digits + name)
        return
    leaves = sorted(n[1:] for n in children(path) if len(n) == split[0] + 1 and n[0] == "L"
                    and n[1:].isascii() and n[1:].isdigit())
    span = 10 ** split[0]
    first = int(digits) * span
    if first > MAX_LEDGER_ID:
        return
    ids = [i for i in (first + int(leaf) for leaf in leaves) if i <= MAX_LEDGER_ID]
    yield first, min(first + span - 1, MAX_LEDGER_ID), ids


def iter_ledger_ranges(root: str, children: Children, manager: Manager = "hierarchical") -> Iterator[Range]:
    """``(first, last, ids)`` per directory of ledger nodes, ascending and disjoint (see
    ``_paths.iter_ledger_ranges``), for any of the three managers."""
    _check_manager(manager)
    if manager != "longhierarchical":
        yield from _paths.iter_ledger_ranges(root, children, manager)
        return
    _paths.ledger_path(root, 0)  # checks root
    for name in _names(children, root, _LONG_SPLIT[0]):
        yield from _long_ranges(children, f"{_base(root)}/{name}", _LONG_SPLIT[1:], name)


def iter_ledger_ids(root: str, children: Children, manager: Manager = "hierarchical") -> Iterator[int]:
    """Every ledger id under ``root`` in ascending order, one directory at a time."""
    _check_manager(manager)
    if manager != "longhierarchical":
        yield from _paths.iter_ledger_ids(root, children, manager)
        return
    for _, _, ids in iter_ledger_ranges(root, children, manager):
        yield from ids


def idgen_prefix(root: str, manager: Manager = "hierarchical") -> str:
    """The path the 31-bit generator creates EPHEMERAL_SEQUENTIAL: ``<root>/idgen/ID-``
    (``<root>/ID-`` for ``flat``)."""
    _check_manager(manager)
    return f"{_base(root)}/ID-" if manager == "flat" else f"{_base(root)}/idgen/ID-"


def _sequence(prefix: str, created: str) -> int:
    """The counter ZooKeeper appended to ``prefix`` in ``created``."""
    if not created.startswith(prefix) or not _SEQUENCE.fullmatch(created[len(prefix):]):
        raise FormatError("not a sequential node of this prefix", prefix=prefix, path=created)
    return int(created[len(prefix):])


def id_from_idgen(prefix: str, created: str) -> int:
    """The ledger id of the sequential node ``created`` (the path ZooKeeper returned for
    a create of ``prefix``); an overflow (>= 2^31 - 1, or negative) raises
    InvalidArgumentError: time for the long generator."""
    value = _sequence(prefix, created)
    if not 0 <= value < INT_MAX:
        raise InvalidArgumentError("31-bit ledger id space exhausted", path=created, counter=value)
    return value


def hob_name(high: int) -> str:
    """The ``idgen-long`` directory of the high 32 bits ``high``: ``HOB-%010d``."""
    if isinstance(high, bool) or not isinstance(high, int) or not 0 <= high <= INT_MAX:
        raise InvalidArgumentError("high-order bits out of range", high=high)
    return f"HOB-{high:010d}"


def parse_hob(name: str) -> int | None:
    """The high bits a ``HOB-`` directory name stands for, or None."""
    match = _HOB.fullmatch(name)
    return int(match.group(1)) if match and int(match.group(1)) <= INT_MAX else None


def long_idgen_prefix(root: str, high: int) -> str:
    """What the long generator creates EPHEMERAL_SEQUENTIAL for high bits ``high``."""
    return f"{_base(root)}/idgen-long/{hob_name(high)}/ID-"


def long_id_from_idgen(root: str, high: int, created: str) -> int:
    """``(high << 32) | counter`` of the sequential node ``created``; a counter past
    2^31 - 1 raises InvalidArgumentError (the next ``HOB-`` directory is due)."""
    return (high << 32) | id_from_idgen(long_idgen_prefix(root, high), created)


def split_long_id(ledger_id: int) -> tuple[int, int]:
    """(high 32 bits, low 32 bits) of a ledger id."""
    _check_id(ledger_id)
    return ledger_id >> 32, ledger_id & 0xFFFFFFFF


def ur_path(root: str, ledger_id: int) -> str:
    """The under-replication mark of ``ledger_id``."""
    _check_id(ledger_id)
    dirs = "/".join(f"{(ledger_id >> shift) & 0xFFFF:04x}" for shift in (48, 32, 16, 0))
    return f"{_base(root)}/underreplication/ledgers/{dirs}/urL{ledger_id:010d}"


def parse_ur_path(root: str, path: str) -> int | None:
    """The ledger id of the mark at exactly ``path``, or None."""
    match = _UR_LEAF.fullmatch(path.rsplit("/", 1)[-1])
    if match is None or len(match.group(1)) > 19 or int(match.group(1)) > MAX_LEDGER_ID:
        return None
    ledger_id = int(match.group(1))
    return ledger_id if ur_path(root, ledger_id) == path else None


def ur_lock_path(root: str, ledger_id: int) -> str:
    """The replication worker's lock on ``ledger_id``'s mark."""
    _check_id(ledger_id)
    return f"{_base(root)}/underreplication/locks/urL{ledger_id:010d}"


def election_path(root: str) -> str:
    """The auditor election's directory; its data names the elected auditor."""
    return f"{_base(root)}/underreplication/auditorelection"


def vote_sequence(name: str) -> int:
    """The counter of a vote ``V_<counter>`` (the lowest is the auditor)."""
    match = _VOTE.fullmatch(name)
    if match is None:
        raise FormatError("not an auditor vote", name=name)
    return int(match.group(1))
