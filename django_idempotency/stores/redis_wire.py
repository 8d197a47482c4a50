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

# Per client (by id, with a reference to tell a reused id), its pool or None: decided once (a
# client's pool and options do not change).
_POOLS: dict[int, tuple[weakref.ref[Any], Any]] = {}
_FITS: dict[type, bool] = {}  # Per pool class: whether get_connection() needs no command name.


def pack(sha: str, key: str, args: Sequence[str | int | bytes]) -> bytes:
    """`EVALSHA sha 1 key *args` in the Redis protocol (RESP), as redis-py would pack it:
    text in UTF-8, integers in decimal."""
    bulks = []
    for arg in (sha, "1", key, *args):
        if type(arg) is str:
            arg = arg.encode()
        elif type(arg) is int:  # Not a bool: redis-py refuses those.
            arg = b"%d" % arg
        elif type(arg) is not bytes:
            # Its type only: an argument may be a client's key or a stored body.
            raise TypeError(f"A script argument is text, bytes or an int, not {type(arg).__name__}")
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
    except (ConnectionError, TimeoutError):
        if connection.retry.get_retries() == 0:
            raise  # As redis-py's call raises it, on a client told not to retry.
        # The connection is closed already; redis-py's own call reconnects and retries as the
        # client is configured to (the script may then run twice: the same as its retry).
        return SLOW
    finally:
        pool.release(connection)


def _pool_of(client: Any) -> Any:
    """The client's connection pool, when a call may go around redis-py's command layer."""
    kept = _POOLS.get(id(client))
    if kept is not None and kept[0]() is client:
        return kept[1]
    pool = _fitting_pool(client)
    # By identity: the native thread's client under gevent has a pool of its own that may
    # compare equal to the shared one. An entry outlives its client only until its id is reused.
    _POOLS[id(client)] = (weakref.ref(client), pool)
    return pool


def _fitting_pool(client: Any) -> Any:
    """The pool of a plain `redis.Redis` client over a pool whose connections read replies
    undecoded and uncached; None for any other."""
    from redis import Redis

    if type(client) is not Redis or client.connection is not None:
        return None  # A cluster, a subclass with its own ways, or a single-connection client.
    pool = client.connection_pool
    kind = type(pool)
    fits = _FITS.get(kind)
    if fits is None:
        fits = _FITS[kind] = _takes_no_arguments(pool.get_connection)
    if not fits or pool.connection_kwargs.get("decode_responses") or getattr(pool, "cache", None):
        return None
    return pool


def _takes_no_arguments(method: Any) -> bool:
    """Whether `method` may be called without arguments (redis-py 5.3 and later)."""
    parameters = inspect.signature(method).parameters.values()
    return all(
        p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in parameters
    )
