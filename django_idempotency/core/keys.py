"""Parse client-supplied idempotency keys and mint new or deterministic ones."""

from __future__ import annotations

import hashlib
import re
import struct
import uuid
from typing import Literal

from ulid import ULID

MAX_KEY_LENGTH = 255
MAX_OWNER_LENGTH = 255  # The owner column's length.
MAX_NAMESPACE_LENGTH = 100  # The namespace column's length.

KeyFormat = Literal["uuid", "ulid", "uuid_or_ulid"]
KEY_FORMATS: tuple[KeyFormat, ...] = ("uuid", "ulid", "uuid_or_ulid")

# A bare token is visible ASCII; an RFC 9651 sf-String may also hold spaces and the escapes \" \\.
_BARE_TOKEN = re.compile(r"[\x21-\x7e]+")
_SF_STRING_BODY = re.compile(r'(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*')
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


class InvalidKey(ValueError):
    """The header value is not a usable idempotency key; the message says why."""


def parse_key(raw: str, key_format: KeyFormat | None = None) -> str:
    """Return the key carried by a header value, or raise `InvalidKey` saying what is wrong."""
    value = raw.strip(" \t")
    if value.startswith('"'):
        if len(value) < 2 or not value.endswith('"') or not _SF_STRING_BODY.fullmatch(value[1:-1]):
            raise InvalidKey(
                "The key is not a valid quoted string: use printable ASCII and escape only"
                ' \\" and \\\\.'
            )
        key = re.sub(r"\\(.)", r"\1", value[1:-1])
        if not key.strip(" "):
            raise InvalidKey("The key is empty: send 1 to 255 visible ASCII characters.")
    else:
        if not value:
            raise InvalidKey("The key is empty: send 1 to 255 visible ASCII characters.")
        if "," in value:
            # Servers join repeated headers with commas: two keys, or a list, is not one key.
            raise InvalidKey(
                "The request carries more than one key (repeated headers, or a comma in the"
                " key): send exactly one; quote a key that contains a comma."
            )
        if not _BARE_TOKEN.fullmatch(value):
            raise InvalidKey(
                "The key holds control, space or non-ASCII characters: send 1 to 255 visible"
                " ASCII characters, or quote it as a structured-field string."
            )
        key = value
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKey(f"The key is {len(key)} characters long; the limit is {MAX_KEY_LENGTH}.")
    if key_format is not None:
        _check_format(key, key_format)
    return key


def _check_format(key: str, key_format: KeyFormat) -> None:
    is_uuid = _UUID.fullmatch(key) is not None
    is_ulid = _is_ulid(key)
    accepted = {
        "uuid": is_uuid,
        "ulid": is_ulid,
        "uuid_or_ulid": is_uuid or is_ulid,
    }[key_format]
    if not accepted:
        wanted = {"uuid": "a UUID", "ulid": "a ULID", "uuid_or_ulid": "a UUID or a ULID"}
        raise InvalidKey(f"The key must be {wanted[key_format]}.")


def _is_ulid(key: str) -> bool:
    if len(key) != 26:
        return False
    try:
        ULID.from_str(key)
    except ValueError:
        return False
    return True


def new_key() -> str:
    """A fresh, time-ordered key (a ULID string) for a client to send."""
    return str(ULID())


def mint_key(*parts: str | int | uuid.UUID, namespace: str = "default") -> str:
    """A deterministic key for calls this project makes downstream: same parts, same key.

    SHA-256 over a length-prefixed encoding (a 4-byte big-endian count, then each part as a
    4-byte big-endian length and its UTF-8 bytes), so ``("ab", "c")`` and ``("a", "bc")`` differ
    and the result is the same on every machine and Python version.
    """
    if not parts:
        raise ValueError("mint_key() needs at least one natural-key part.")
    encoded = [namespace.encode(), *(str(part).encode() for part in parts)]
    if any(not chunk.strip() for chunk in encoded[1:]):
        raise ValueError("mint_key() parts must not be blank.")
    digest = hashlib.sha256(struct.pack(">I", len(encoded)))
    for chunk in encoded:
        digest.update(struct.pack(">I", len(chunk)))
        digest.update(chunk)
    return digest.hexdigest()


def key_hash(key: str) -> str:
    """What logs and traces show of a key: enough to follow one key, never the key itself,
    which may carry client data."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]
