"""The protobuf wire format, read field by field without a generated class: what the ingest edge
needs to split a batch without decoding its events, and what the event log needs to read an agent's
`data` Struct out of the message it kept, without either depending on the other."""

from __future__ import annotations

from collections.abc import Iterator

LENGTH_DELIMITED = 2


class WireError(ValueError):
    """Bytes that are not a protobuf message of the expected shape."""


def varint(raw: bytes, i: int) -> tuple[int, int]:
    """The varint at `raw[i:]` and the index after it (IndexError when truncated)."""
    shift = value = 0
    while True:
        byte = raw[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7


def length_delimited_fields(raw: bytes) -> Iterator[tuple[int, bytes]]:
    """(field number, bytes) of every field of a message whose fields are all length-delimited
    (strings, bytes, messages); WireError for any other wire type or truncated bytes."""
    i, end = 0, len(raw)
    try:
        while i < end:
            key, i = varint(raw, i)
            if key & 7 != LENGTH_DELIMITED:
                raise WireError(f"field {key >> 3} has wire type {key & 7}, not length-delimited")
            length, i = varint(raw, i)
            if i + length > end:
                raise WireError("truncated")
            yield key >> 3, raw[i : i + length]
            i += length
    except IndexError:
        raise WireError("truncated") from None
