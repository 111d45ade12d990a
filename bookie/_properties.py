"""Java properties files as BookKeeper reads its ``bk_server.conf``.

Theory of operation. BookKeeper (4.18) loads its configuration with Apache Commons
Configuration 2's ``PropertiesConfiguration`` and a ``DefaultListDelimiterHandler(',')``:
the grammar is ``java.util.Properties.load``'s plus comma-separated list values. This module is our own reading of those documented rules, in three steps:

1. Natural lines end at ``\\n``, ``\\r`` or ``\\r\\n``. Leading whitespace (space, tab, form
   feed) is skipped; a blank line is nothing; a line whose first character is ``#`` or
   ``!`` is a comment. A line ending in an odd number of backslashes continues on the next
   one: the backslash and the line end are dropped and so is the next line's leading
   whitespace (a continuation line is never a comment). Together they form a logical line.
2. A logical line's key runs to the first unescaped ``=``, ``:`` or whitespace; then
   whitespace, at most one ``=`` or ``:``, and whitespace again are skipped; the rest is
   the value (trailing whitespace kept, as Java keeps it).
3. Escapes: ``\\t \\n \\r \\f`` and ``\\uXXXX`` (exactly four hex digits; anything else is an
   error; two that make a UTF-16 surrogate pair are one character) are those characters;
   a backslash before any other character is that character (``\\=``, ``\\:``, ``\\ ``, ``\\\\``, ``\\#``).

Commons Configuration adds (:func:`load_configuration`): a value is a list split at its
unescaped commas (``\\,`` is a comma inside an element), each element trimmed; a key given
twice accumulates its elements (``java.util.Properties`` keeps the last: :func:`load_properties`).
Files are decoded as UTF-8, else ISO-8859-1 (Java's default for ``.properties``).
"""

from __future__ import annotations

from collections.abc import Iterator

from walkit.errors import ConfigError

__all__ = ["decode", "load_configuration", "load_properties", "logical_lines", "split_list", "split_pair",
           "unescape"]

_WHITESPACE = " \t\f"
_SIMPLE = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_HEX = frozenset("0123456789abcdefABCDEF")


def decode(data: bytes) -> str:
    """UTF-8 text, else ISO-8859-1 (every byte a character)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("iso-8859-1")


def _trailing_backslashes(line: str) -> int:
    return len(line) - len(line.rstrip("\\"))


def logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(number of its first natural line, the logical line), comments and blank lines left out."""
    natural = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    i = 0
    while i < len(natural):
        start = i
        line = natural[i].lstrip(_WHITESPACE)
        i += 1
        if not line or line[0] in "#!":
            continue
        while _trailing_backslashes(line) % 2 == 1:
            line = line[:-1]
            if i >= len(natural):
                break
            line += natural[i].lstrip(_WHITESPACE)
            i += 1
        yield start + 1, line


def split_pair(line: str) -> tuple[str, str]:
    """A logical line's raw (still escaped) key and value."""
    i, n = 0, len(line)
    while i < n and line[i] not in "=:" + _WHITESPACE:
        i += 2 if line[i] == "\\" else 1
    i = min(i, n)
    key = line[:i]
    while i < n and line[i] in _WHITESPACE:
        i += 1
    if i < n and line[i] in "=:":
        i += 1
        while i < n and line[i] in _WHITESPACE:
            i += 1
    return key, line[i:]


def unescape(raw: str, line: int = 0) -> str:
    """``raw`` with its escapes replaced; ConfigError for a malformed ``\\uXXXX``."""
    out: list[str] = []
    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        if c != "\\" or i + 1 >= n:
            out.append(c)
            i += 1
            continue
        c = raw[i + 1]
        if c == "u":
            digits = raw[i + 2:i + 6]
            if len(digits) != 4 or not set(digits) <= _HEX:
                raise ConfigError("malformed \\uXXXX escape in a properties file", line=line or None,
                                  text=raw[i:i + 6])
            out.append(chr(int(digits, 16)))
            i += 6
            continue
        out.append(_SIMPLE.get(c, c))
        i += 2
    text = "".join(out)
    if "\\u" in raw:  # Java strings are UTF-16: a pair of surrogate escapes is one character
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    return text


def split_list(raw: str, line: int = 0) -> list[str]:
    """A raw value's elements as Commons Configuration sees them: split at unescaped
    commas, each unescaped and trimmed (Java's trim: characters up to U+0020)."""
    parts: list[str] = []
    start = i = 0
    while i < len(raw):
        if raw[i] == "\\":
            i += 2
            continue
        if raw[i] == ",":
            parts.append(raw[start:i])
            start = i + 1
        i += 1
    parts.append(raw[start:])
    return [_java_trim(unescape(p, line)) for p in parts]


def _java_trim(text: str) -> str:
    return text.strip("".join(chr(c) for c in range(0x21)))


def load_properties(text: str) -> dict[str, str]:
    """``java.util.Properties.load``: key -> value, the last of a repeated key."""
    result: dict[str, str] = {}
    for number, line in logical_lines(text):
        key, value = split_pair(line)
        result[unescape(key, number)] = unescape(value, number)
    return result


def load_configuration(text: str) -> dict[str, list[str]]:
    """Commons Configuration's reading: key -> its list of elements, in file order (a key
    given twice has the elements of both)."""
    result: dict[str, list[str]] = {}
    for number, line in logical_lines(text):
        key, value = split_pair(line)
        result.setdefault(unescape(key, number), []).extend(split_list(value, number))
    return result
