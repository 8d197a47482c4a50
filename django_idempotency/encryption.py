"""Encryption at rest of stored responses: sealed before any store sees them, opened on replay."""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from django.core.exceptions import ImproperlyConfigured

from django_idempotency.core.outcomes import StoredResponse
from django_idempotency.exceptions import IdempotencyError

if TYPE_CHECKING:
    from cryptography.fernet import MultiFernet

# The only header of a sealed response; its value names the scheme. Not a field name (RFC 9110
# tokens have no colon), so no view can set it, and a record without it is plaintext: one stored
# before encryption was enabled.
ENCRYPTED_HEADER = ":encrypted"
SCHEME = "fernet"
_LENGTH = struct.Struct(">I")  # Of the JSON head (headers, reason) before the raw body.


class UnreadableResponse(IdempotencyError):
    """A stored response encrypted with a key no longer in IDEMPOTENCY_ENCRYPTION_KEYS."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status  # The stored response's, kept in clear.


class UnreadableStep(UnreadableResponse):
    """A stored step result encrypted with a key no longer (or not yet) in
    IDEMPOTENCY_ENCRYPTION_KEYS: the operation stops there, its step not run again."""


def fernet_for(keys: Sequence[str | bytes], setting: str) -> MultiFernet:
    """A MultiFernet over `keys`, newest first: it encrypts with the first, decrypts with any."""
    try:
        from cryptography.fernet import Fernet, MultiFernet
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"{setting} needs the cryptography package: "
            "pip install 'django-idempotency[encryption]'."
        ) from exc
    if isinstance(keys, str | bytes) or not keys:
        raise ImproperlyConfigured(
            f"{setting} must be a non-empty list of Fernet keys (newest first), not {keys!r}."
        )
    fernets = []
    for position, key in enumerate(keys):
        try:
            fernets.append(Fernet(key))
        except (TypeError, ValueError) as exc:
            # The key itself is a secret: name its position, never its value.
            raise ImproperlyConfigured(
                f"{setting}[{position}] is not a Fernet key (32 url-safe base64-encoded bytes): "
                "make one with cryptography.fernet.Fernet.generate_key()."
            ) from exc
    return MultiFernet(fernets)


def is_sealed(stored: StoredResponse) -> bool:
    return bool(stored.headers) and stored.headers[0][0] == ENCRYPTED_HEADER


def seal(stored: StoredResponse, fernet: MultiFernet | None) -> StoredResponse:
    """What a store keeps of `stored`: with a key, its headers, reason phrase and body as one
    Fernet token, and only the status in clear (the admin filters and purges by it)."""
    if fernet is None:
        return stored
    head = json.dumps([stored.headers, stored.reason], separators=(",", ":")).encode()
    token = fernet.encrypt(_LENGTH.pack(len(head)) + head + stored.body)
    return StoredResponse(stored.status, [(ENCRYPTED_HEADER, SCHEME)], token)


def unseal(stored: StoredResponse, fernet: MultiFernet | None) -> StoredResponse:
    """The response as the view sent it; a plaintext one as it is.

    Raises `UnreadableResponse` when no configured key opens it.
    """
    if not is_sealed(stored):
        return stored
    if fernet is None:
        raise UnreadableResponse(
            "The stored response is encrypted, and IDEMPOTENCY_ENCRYPTION_KEYS is not set: "
            "put the key it was encrypted with back in the list.",
            stored.status,
        )
    from cryptography.fernet import InvalidToken

    try:
        plain = fernet.decrypt(stored.body)
    except InvalidToken:
        raise UnreadableResponse(
            "The stored response was encrypted with a key no longer in "
            "IDEMPOTENCY_ENCRYPTION_KEYS: keep a retired key in the list (after the new one) "
            "until the records it encrypted have expired.",
            stored.status,
        ) from None
    (length,) = _LENGTH.unpack_from(plain)
    end = _LENGTH.size + length
    headers, reason = json.loads(plain[_LENGTH.size : end])
    return replace(
        stored, headers=[(str(n), str(v)) for n, v in headers], body=plain[end:], reason=reason
    )


# A step's stored result starts with one of these: sealed, or as the step returned it.
_SEALED_STEP, _PLAIN_STEP = b"E", b"P"


def seal_step(result: bytes, fernet: MultiFernet | None) -> bytes:
    """What a store keeps of a step's result: encrypted as responses are, when keys are set."""
    if fernet is None:
        return _PLAIN_STEP + result
    return _SEALED_STEP + fernet.encrypt(result)


def unseal_step(stored: bytes, fernet: MultiFernet | None) -> bytes:
    """A step's result as it returned it. Raises `UnreadableResponse` when no key opens it."""
    if stored[:1] != _SEALED_STEP:
        return stored[1:]
    if fernet is None:
        raise UnreadableStep(
            "A stored step result is encrypted, and IDEMPOTENCY_ENCRYPTION_KEYS is not set: put "
            "the key it was encrypted with back in the list.",
            200,
        )
    from cryptography.fernet import InvalidToken

    try:
        return fernet.decrypt(stored[1:])
    except InvalidToken:
        raise UnreadableStep(
            "A stored step result was encrypted with a key no longer in "
            "IDEMPOTENCY_ENCRYPTION_KEYS: keep a retired key in the list (after the new one) "
            "until the records it encrypted have expired, and give every server a new key "
            "before any server encrypts with it.",
            200,
        ) from None
