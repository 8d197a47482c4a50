"""Connections a database restart left dead (kept open by CONN_MAX_AGE), replaced in time."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError, connections

T = TypeVar("T")


def on_a_live_connection(action: Callable[[], T]) -> T:
    """Run `action`, the request's first statements, which change nothing; if a database error
    came from a dead connection kept open by CONN_MAX_AGE (the database restarted), replace it
    and run `action` once more, so that a database that is back answers instead of an error."""
    try:
        return action()
    except DatabaseError:
        if not _replace_dead_connections():
            raise
    return action()


def _replace_dead_connections() -> bool:
    """Close the open connections that no longer answer; True if there was one.

    A connection inside a transaction is left alone: the transaction is lost with it anyway.
    """
    replaced = False
    for connection in connections.all(initialized_only=True):
        if connection.connection is None or connection.in_atomic_block:
            continue
        if not connection.is_usable():
            with contextlib.suppress(DatabaseError):
                connection.close()
            replaced = True
    return replaced
