"""Whether a statement fits in MariaDB's max_allowed_packet, asked once per connection."""

from __future__ import annotations

from typing import Any
from weakref import WeakKeyDictionary

from django.db.backends.base.base import BaseDatabaseWrapper

# Statements up to this size are sent without asking: no MariaDB takes less by default (16 MiB
# since 10.2), and IDEMPOTENCY_MAX_STORED_BYTES keeps bodies below 1 MiB unless raised. Above
# it the server's limit is read once per connection (a session cannot change it).
ASKED_ABOVE = 1024 * 1024
# The statement's own text and the framing around its values.
_OVERHEAD = 4096
# Bytes the client escapes with a backslash in a quoted literal.
_ESCAPED = (b"\\", b"'", b'"', b"\x00", b"\n", b"\r", b"\x1a")

_LIMITS: WeakKeyDictionary[Any, int] = WeakKeyDictionary()


def fits_in_a_packet(connection: BaseDatabaseWrapper, params: list[Any]) -> bool:
    """Whether a statement with these parameters fits in the server's max_allowed_packet, as
    the client will send it: bytes and text quoted, their special bytes escaped."""
    size = _OVERHEAD + sum(_quoted_size(value) for value in params)
    if size <= ASKED_ABOVE:
        return True
    connection.ensure_connection()
    raw = connection.connection
    if raw not in _LIMITS:
        with connection.cursor() as cursor:
            cursor.execute("SELECT @@max_allowed_packet")
            (_LIMITS[raw],) = cursor.fetchone()
    return size <= _LIMITS[raw]


def _quoted_size(value: Any) -> int:
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogatepass")
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        return len(data) + sum(data.count(byte) for byte in _ESCAPED) + 16
    return len(str(value)) + 16
