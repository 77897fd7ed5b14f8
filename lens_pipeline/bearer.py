"""Bearer tokens, as the read API, the watch cache and the ingest sidecar check them.

A setting may hold several tokens, comma-separated: a rotation adds the new one, moves the
clients to it, then drops the old one (docs/OPERATIONS.md). A presented token is compared with
every accepted one in constant time, so which one matched, or how much of one, never leaks
through timing.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Sequence
from typing import TypeVar

K = TypeVar("K")


def split_tokens(setting: str | None) -> list[str]:
    """The tokens of a comma-separated setting, blanks around them and empty entries dropped."""
    return [token.strip() for token in (setting or "").split(",") if token.strip()]


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (blanks around the header dropped,
    as HTTP drops them); None for no header, another scheme, or a token that is empty or holds a
    blank ("Bearer  t" is refused, as kube-apiserver refuses it)."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not token or any(c.isspace() for c in token):
        return None
    return token


def matching(given: str, accepted: Iterable[tuple[K, str]]) -> K | None:
    """The key of the accepted token `given` equals, or None; every token is compared."""
    presented = given.encode()
    found = None
    for key, expected in accepted:
        if hmac.compare_digest(presented, expected.encode()):
            found = key
    return found


def accepts(authorization: str | None, tokens: Sequence[str]) -> bool:
    """Whether the header carries one of `tokens`; any request passes when there are none."""
    if not tokens:
        return True
    given = bearer_token(authorization)
    return given is not None and matching(given, ((True, token) for token in tokens)) is not None
