"""Which wire dialect a connection speaks, from its first frame.

Theory of operation. A bookie port may hear three dialects: walkit's own
(:mod:`walkit.protocol._codec`), BookKeeper's v3 (:mod:`walkit.protocol._bk_v3`,
protobuf) and BookKeeper's v2 (:mod:`walkit.protocol._bk_v2`, binary). All three cut
frames with the same 4-byte big-endian length, so the first frame's body decides, once
per connection (later frames are never re-examined):

* BookKeeper's bookie (BookieProtoEncoding.RequestDecoder) tries v3 first and, when the
  bytes are no protobuf Request, falls back to v2 for good. The same test works here
  and is unambiguous: a v3 Request starts with its header field, tag 0x0A (field 1,
  length-delimited); a v2 header's first byte is the version 2, which as a protobuf
  tag would be field 0, never valid - so no v2 frame parses as v3.
* walkit's frames start with the protocol version byte (1), never 0x0A or 2.

:func:`detect_dialect` returns the :class:`Dialect`; :func:`codec_for` the module with
the four entry points (``decode_request``, ``encode_response``, ``encode_request``,
``decode_response``) for it. A first frame none of them accepts is a ProtocolError.
"""

from __future__ import annotations

from enum import Enum
from types import ModuleType
from typing import Any

from google.protobuf.message import DecodeError

from walkit.errors import ProtocolError
from walkit.protocol import _bk_v2, _bk_v3, _codec
from walkit.protocol import _bk_v3_pb2
from walkit.protocol._codes import PROTOCOL_VERSION
from walkit.protocol._frames import Buffer

pb: Any = _bk_v3_pb2  # generated code: its classes are made at import, unknown to mypy

__all__ = ["Dialect", "detect_dialect", "codec_for"]

_V3_TAG = 0x0A  # protobuf field 1 (Request.header), wire type 2


class Dialect(Enum):
    WALKIT = "walkit"
    BK_V3 = "bk-v3"
    BK_V2 = "bk-v2"


def _is_v3(frame: bytes) -> bool:
    req = pb.Request()
    try:
        req.ParseFromString(frame)
    except (DecodeError, RuntimeError, ValueError):
        return False
    return bool(req.IsInitialized())


def detect_dialect(first_frame: Buffer) -> Dialect:
    """The dialect of a connection whose first frame (without its length prefix) this is."""
    data = bytes(first_frame)
    if not data:
        raise ProtocolError("empty first frame", reason="dialect unknown")
    if data[0] == PROTOCOL_VERSION:
        return Dialect.WALKIT
    if data[0] == _V3_TAG and _is_v3(data):
        return Dialect.BK_V3
    if data[0] == _bk_v2.V2_VERSION:
        return Dialect.BK_V2
    raise ProtocolError("first frame is in no dialect this bookie speaks", first_byte=f"0x{data[0]:02x}",
                        size=len(data), reason="dialect unknown")


_CODECS: dict[Dialect, ModuleType] = {Dialect.WALKIT: _codec, Dialect.BK_V3: _bk_v3, Dialect.BK_V2: _bk_v2}


def codec_for(dialect: Dialect) -> ModuleType:
    """The codec module of ``dialect``: ``decode_request`` / ``encode_response`` (bookie)
    and ``encode_request`` / ``decode_response`` (client); the BookKeeper ones also
    ``encode_error(request, status)``."""
    return _CODECS[dialect]
