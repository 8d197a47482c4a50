"""A script call to a single Redis, packed here and sent on a connection of the client's pool."""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Sequence
from typing import Any

# A request makes one or two script calls. Through redis-py's command layer each cost about 250
# function calls (each argument's encoding, the retry wrapper, observability hooks, response
# callbacks); packed here and sent on a connection of the pool, about 130. What is left is what
# makes the call correct: the pool's checks of the connection it hands out (a closed or dirty
# one is reconnected) and the parser's reading of the reply and its errors.

SLOW = object()  # What `call` answers when the client must be called the ordinary way.

# Per live client (by id, with a reference to tell a reused id): whether its calls may go around
# redis-py's command layer, decided once (a client's pool and options do not change).
_FITTING: dict[int, tuple[weakref.ref[Any], bool]] = {}


def pack(sha: str, key: str, args: Sequence[str | int | bytes]) -> bytes:
    """`EVALSHA sha 1 key *args` in the Redis protocol (RESP), as redis-py's encoder packs it:
    bytes as they are, text (a `str` subclass too: a `StrEnum` namespace, a `SafeString` reason)
    in UTF-8, integers (an `IntEnum` too) in decimal, floats as their `repr`. Anything else is
    redis-py's `DataError`, as its encoder raises."""
    bulks = []
    for arg in (sha, "1", key, *args):
        # The exact types first: nearly every argument is one.
        if type(arg) is str:
            arg = arg.encode()
        elif type(arg) is int:
            arg = b"%d" % arg
        elif isinstance(arg, bytes):
            pass
        elif isinstance(arg, memoryview):
            arg = arg.tobytes()
        elif isinstance(arg, str):
            arg = str.encode(arg)
        elif isinstance(arg, int) and not isinstance(arg, bool):  # redis-py refuses a bool.
            arg = b"%d" % arg
        elif isinstance(arg, float):
            arg = repr(arg).encode()
        else:
            from redis.exceptions import DataError

            # Its type only: an argument may be a client's key or a stored body.
            raise DataError(f"A script argument is text, bytes or an int, not {type(arg).__name__}")
        bulks.append(b"$%d\r\n%b\r\n" % (len(arg), arg))
    return b"*%d\r\n$7\r\nEVALSHA\r\n%b" % (len(bulks) + 1, b"".join(bulks))


def call(client: Any, sha: str, key: str, args: Sequence[str | int | bytes]) -> Any:
    """The script's answer, or `SLOW` when this client is one to call through redis-py: a
    Redis Cluster, a client pinned to one connection, a pool of another kind, a client
    decoding replies or caching them on the client side, or a call whose connection failed on
    a client that retries (redis-py's retries then decide, as they would have)."""
    from redis.exceptions import ConnectionError, TimeoutError

    pool = _pool_of(client)
    if pool is None:
        return SLOW
    packed = pack(sha, key, args)
    # A connection that cannot be had fails here as it fails redis-py's call (which does not
    # retry that either; the connection's own connect did, as configured).
    connection = pool.get_connection()
    try:
        connection.send_packed_command([packed])
        return connection.read_response()
    except (ConnectionError, TimeoutError) as failure:
        if not _retried(connection.retry, failure):
            raise  # As redis-py's call raises it, on a client not told to retry this error.
        # The connection is closed already; redis-py's own call reconnects and retries as the
        # client is configured to (the script may then run twice: the same as its retry).
        return SLOW
    finally:
        pool.release(connection)


def _pool_of(client: Any) -> Any:
    """The client's connection pool, when a call may go around redis-py's command layer."""
    kept = _FITTING.get(id(client))
    if kept is None or kept[0]() is not client:
        kept = _FITTING[id(client)] = (_forgotten_with(client), _fits(client))
    return client.connection_pool if kept[1] else None


def _forgotten_with(client: Any) -> weakref.ref[Any]:
    """A reference to `client` whose end drops its entry (unless its id already serves another
    client): a dropped client's pool and connections are not kept alive here."""
    key = id(client)

    def forget(reference: weakref.ref[Any]) -> None:
        kept = _FITTING.get(key)
        if kept is not None and kept[0] is reference:
            del _FITTING[key]

    return weakref.ref(client, forget)


def _retried(retry: Any, failure: Exception) -> bool:
    """Whether redis-py's call retries this failure, as the connection's `Retry` says."""
    supported = getattr(retry, "_supported_errors", ())
    return retry.get_retries() != 0 and isinstance(failure, supported)


def _fits(client: Any) -> bool:
    """Whether `client` is a plain `redis.Redis` over a pool whose connections read replies
    undecoded and uncached, handing them out without a command name."""
    from redis import Redis

    if type(client) is not Redis or client.connection is not None:
        return False  # A cluster, a subclass with its own ways, or a single-connection client.
    pool = client.connection_pool
    return (
        _takes_no_arguments(pool.get_connection)
        and not pool.connection_kwargs.get("decode_responses")
        and not getattr(pool, "cache", None)
    )


def _takes_no_arguments(method: Any) -> bool:
    """Whether `method` may be called without arguments (redis-py 5.3 and later)."""
    parameters = inspect.signature(method).parameters.values()
    return all(
        p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in parameters
    )
