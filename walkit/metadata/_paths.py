"""Where a ledger's metadata lives in the store, as BookKeeper's ledger managers lay it out.

``hierarchical`` (BookKeeper's default, "hybrid"): ids below ``Integer.MAX_VALUE``
(2^31 - 1) take the legacy 2-4-4 split of the 10-digit id, ``<root>/00/0000/L0001``;
larger ids the long 3-4-4-4-4 split of the 19-digit id,
``<root>/000/0000/0021/4748/L3647``. ``flat``: ``<root>/L0000000001`` (10 digits, more
if the id needs them).

The names are zero-padded, so sorting the names of one level sorts the ids below it;
legacy top-level directories have 2 digits, long ones 3, and every legacy id is below
every long id. :func:`iter_ledger_ids` uses that to list a tree in ascending id order one
directory at a time. Parsing is strict: a path is a ledger path only if
:func:`ledger_path` would have produced exactly it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Literal

from walkit.errors import InvalidArgumentError

__all__ = [
    "Layout",
    "LAYOUTS",
    "ledger_path",
    "ledger_path_prefixes",
    "parse_ledger_path",
    "iter_ledger_ids",
    "iter_ledger_ranges",
]

Layout = Literal["hierarchical", "flat"]
LAYOUTS: tuple[Layout, ...] = ("hierarchical", "flat")
MAX_LEDGER_ID = (1 << 63) - 1
LEGACY_LIMIT = (1 << 31) - 1  # Integer.MAX_VALUE: ids below it use the 2-4-4 path
_LEGACY_SPLIT = (2, 4, 4)
_LONG_SPLIT = (3, 4, 4, 4, 4)
_DIGITS = re.compile(r"[0-9]+")
_FLAT_LEAF = re.compile(r"L[0-9]{10,}")


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise InvalidArgumentError("unknown ledger layout", layout=layout, known=",".join(LAYOUTS))


def _prefix(root: str) -> str:
    """``root`` as the prefix of its children ("" for "/")."""
    if root == "/":
        return ""
    if not root.startswith("/") or root.endswith("/") or "//" in root:
        raise InvalidArgumentError("root must be an absolute path without trailing slash", root=root)
    return root


def _check_id(ledger_id: int) -> None:
    if isinstance(ledger_id, bool) or not isinstance(ledger_id, int) or not 0 <= ledger_id <= MAX_LEDGER_ID:
        raise InvalidArgumentError("ledger id out of range", ledger=ledger_id)


def _split(ledger_id: int) -> list[str]:
    """The path components (directories, then the leaf) of a hierarchical id."""
    width, split = (10, _LEGACY_SPLIT) if ledger_id < LEGACY_LIMIT else (19, _LONG_SPLIT)
    digits = f"{ledger_id:0{width}d}"
    parts, at = [], 0
    for size in split:
        parts.append(digits[at:at + size])
        at += size
    parts[-1] = "L" + parts[-1]
    return parts


def ledger_path(root: str, ledger_id: int, layout: Layout = "hierarchical") -> str:
    """The store path of ``ledger_id``'s metadata under ``root``."""
    _check_layout(layout)
    _check_id(ledger_id)
    if layout == "flat":
        return f"{_prefix(root)}/L{ledger_id:010d}"
    return _prefix(root) + "/" + "/".join(_split(ledger_id))


def ledger_path_prefixes(root: str, ledger_id: int, layout: Layout = "hierarchical") -> tuple[str, ...]:
    """The directories between ``root`` (excluded) and the ledger's node, outermost
    first: what must exist before the ledger node can be created."""
    path = ledger_path(root, ledger_id, layout)
    base = len(_prefix(root))
    cuts = [i for i, char in enumerate(path) if char == "/" and i > base]
    return tuple(path[:i] for i in cuts)


def parse_ledger_path(root: str, path: str, layout: Layout = "hierarchical") -> int | None:
    """The ledger id whose path is exactly ``path``, or None."""
    _check_layout(layout)
    prefix = _prefix(root) + "/"
    if not path.startswith(prefix):
        return None
    rest = path[len(prefix):]
    digits = rest[1:] if layout == "flat" else rest.replace("/", "").replace("L", "", 1)
    if not _DIGITS.fullmatch(digits) or len(digits) > 19:
        return None
    ledger_id = int(digits)
    if ledger_id > MAX_LEDGER_ID or ledger_path(root, ledger_id, layout) != path:
        return None
    return ledger_id


Children = Callable[[str], list[str]]


def _sorted_dirs(children: Children, path: str, width: int) -> list[str]:
    names = [n for n in children(path) if len(n) == width and _DIGITS.fullmatch(n)]
    return sorted(names)


def _walk(root: str, children: Children, path: str, split: tuple[int, ...]) -> Iterator[int]:
    """Ids below ``path`` whose remaining components have widths ``split``."""
    if len(split) == 1:
        leaves = sorted(n for n in children(path) if n.startswith("L") and len(n) == split[0] + 1)
        for leaf in leaves:
            ledger_id = parse_ledger_path(root, f"{path}/{leaf}")
            if ledger_id is not None:
                yield ledger_id
        return
    for name in _sorted_dirs(children, path, split[0]):
        yield from _walk(root, children, f"{path}/{name}", split[1:])


def _walk_flat(root: str, children: Children) -> Iterator[int]:
    ids = (parse_ledger_path(root, f"{_prefix(root)}/{n}", "flat") for n in children(root) if _FLAT_LEAF.fullmatch(n))
    yield from sorted(i for i in ids if i is not None)


def iter_ledger_ids(root: str, children: Children, layout: Layout = "hierarchical") -> Iterator[int]:
    """Every ledger id under ``root`` in ascending order.

    ``children(path)`` lists the child names of a node. The hierarchical walk lists one
    directory at a time, lazily, and only directories whose names fit the layout;
    ``flat`` has a single directory and must list it whole.
    """
    _check_layout(layout)
    if layout == "flat":
        return _walk_flat(root, children)
    return _walk_hierarchical(root, children)


def _walk_hierarchical(root: str, children: Children) -> Iterator[int]:
    top = children(root)
    prefix = _prefix(root)
    for split in (_LEGACY_SPLIT, _LONG_SPLIT):
        names = sorted(n for n in top if len(n) == split[0] and _DIGITS.fullmatch(n))
        for name in names:
            yield from _walk(root, children, f"{prefix}/{name}", split[1:])


def iter_ledger_ranges(root: str, children: Children,
                       layout: Layout = "hierarchical") -> Iterator[tuple[int, int, list[int]]]:
    """``(first, last, ids)`` for every directory that holds ledger nodes, in ascending
    order: the id range the directory covers and the ids it holds (sorted, within the
    range). The ranges are disjoint; an id in no range has no node anywhere. One
    directory is listed at a time (at most 10,000 names in the hierarchical layout);
    ``flat`` is one range over every id, and must list its single directory whole."""
    _check_layout(layout)
    if layout == "flat":
        yield 0, MAX_LEDGER_ID, list(_walk_flat(root, children))
        return
    top = children(root)
    prefix = _prefix(root)
    for split, low, high in ((_LEGACY_SPLIT, 0, LEGACY_LIMIT - 1), (_LONG_SPLIT, LEGACY_LIMIT, MAX_LEDGER_ID)):
        for name in sorted(n for n in top if len(n) == split[0] and _DIGITS.fullmatch(n)):
            yield from _ranges(root, children, f"{prefix}/{name}", split[1:], name, (low, high))


def _ranges(root: str, children: Children, path: str, split: tuple[int, ...], digits: str,
            bounds: tuple[int, int]) -> Iterator[tuple[int, int, list[int]]]:
    if len(split) > 1:
        for name in _sorted_dirs(children, path, split[0]):
            yield from _ranges(root, children, f"{path}/{name}", split[1:], digits + name, bounds)
        return
    span = 10 ** split[0]
    first, last = max(int(digits) * span, bounds[0]), min(int(digits) * span + span - 1, bounds[1])
    if first <= last:
        yield first, last, list(_walk(root, children, path, split))
