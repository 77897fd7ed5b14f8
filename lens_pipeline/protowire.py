"""The protobuf wire format, read field by field without a generated class: what the ingest edge
needs to split a batch without decoding its events, and what the event log needs to read an agent's
`data` Struct out of the message it kept, without either depending on the other."""

from __future__ import annotations

from collections.abc import Iterator

VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5
FIXED_WIDTH = {FIXED64: 8, FIXED32: 4}


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


def length_delimited_fields(raw: bytes, *, skip_scalars: bool = False) -> Iterator[tuple[int, bytes]]:
    """(field number, bytes) of every length-delimited field (strings, bytes, messages) of a message.

    Strict by default: WireError for any other wire type, as for a message whose fields must all be
    length-delimited. With `skip_scalars`, varint and fixed-width fields (numbers, bools) are
    stepped over. WireError for truncated bytes and for group wire types either way."""
    i, end = 0, len(raw)
    try:
        while i < end:
            key, i = varint(raw, i)
            wire_type = key & 7
            if skip_scalars and wire_type == VARINT:
                _, i = varint(raw, i)
                continue
            if skip_scalars and wire_type in FIXED_WIDTH:
                i += FIXED_WIDTH[wire_type]
                if i > end:
                    raise WireError("truncated")
                continue
            if wire_type != LENGTH_DELIMITED:
                raise WireError(f"field {key >> 3} has wire type {wire_type}, not length-delimited")
            length, i = varint(raw, i)
            if i + length > end:
                raise WireError("truncated")
            yield key >> 3, raw[i : i + length]
            i += length
    except IndexError:
        raise WireError("truncated") from None
