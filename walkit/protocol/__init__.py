"""Sans-IO codecs shared by the client and the bookie (no sockets in here)."""

from walkit.protocol._entry import (
    ENTRY_HEADER,
    DigestType,
    EntryHeader,
    decode_entry,
    digest_size,
    encode_entry,
    master_key,
    parse_entry_header,
)

__all__ = [
    "ENTRY_HEADER",
    "DigestType",
    "EntryHeader",
    "decode_entry",
    "digest_size",
    "encode_entry",
    "master_key",
    "parse_entry_header",
]
