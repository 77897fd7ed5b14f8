"""How a collector says that one object could not be read."""

from __future__ import annotations

from dataclasses import dataclass


class MalformedObject(ValueError):
    """An object lacks a field or has one of the wrong type; the message says which and what was expected."""


@dataclass(frozen=True)
class Problem:
    kind: str
    name: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name or '<unnamed>'}: {self.message}"


def text_without_nul(row: dict) -> dict:
    """`row` itself, or a malformed object naming the first text column with a NUL character (which
    PostgreSQL's text types refuse: one such value would fail the whole cluster's write)."""
    for column, value in row.items():
        if value.__class__ is str and "\x00" in value:
            raise MalformedObject(f"{column} contains a NUL character")
    return row


def object_name(obj: object) -> str:
    """`namespace/name` or `name` of an object, or '' when even that is unreadable."""
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(metadata, dict) or not isinstance(metadata.get("name"), str):
        return ""
    namespace = metadata.get("namespace")
    return f"{namespace}/{metadata['name']}" if isinstance(namespace, str) and namespace else metadata["name"]


def mapping(obj: dict, *path: str, required: bool = False) -> dict:
    """The dict at `path` inside `obj`; {} when absent (or an error when `required`); wrong types are errors."""
    if len(path) == 1 and obj.__class__ is dict:  # the common case, about a million times a run
        found = obj.get(path[0])
        if found.__class__ is dict:
            return found
    current: object = obj
    walked = []
    for part in path:
        walked.append(part)
        if not isinstance(current, dict):
            raise MalformedObject(f"{'.'.join(walked[:-1]) or 'object'} is not an object")
        current = current.get(part)
        if current is None:
            if required:
                raise MalformedObject(f"missing {'.'.join(walked)}")
            return {}
    if not isinstance(current, dict):
        raise MalformedObject(f"{'.'.join(walked)} should be an object, got {type(current).__name__}")
    return current
