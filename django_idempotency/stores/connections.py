"""Connections a database restart left dead (kept open by CONN_MAX_AGE), replaced in time."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from django.db import DatabaseError, connections

T = TypeVar("T")


def on_a_live_connection(action: Callable[[], T]) -> T:
    """Run `action`, among a request's first statements; if its first statement failed on a
    dead connection kept open by CONN_MAX_AGE (the database restarted), replace that connection
    and run `action` once more, so that a database that is back answers instead of an error.

    Only then: a statement sent down a dead connection reached no database, and nothing went
    through before it, so running `action` again repeats none of its database work (a project's
    owner resolver or DRF authenticator may write). An error from a live connection, a dead
    connection met after a statement that went through, or one inside a transaction (lost with
    it), is raised as it is.
    """
    every = connections.all()
    # Only a connection already open can be one a restart left dead (one in a transaction is
    # lost with it): without one (CONN_MAX_AGE = 0), nothing is watched.
    if not any(c.connection is not None and not c.in_atomic_block for c in every):
        return action()
    # Every connection is watched, a new one too: a statement that went through on any of
    # them forbids running `action` again.
    statements = _Statements()
    watched = [(connection, partial(statements.watch, connection.alias)) for connection in every]
    for connection, watch in watched:
        connection.execute_wrappers.append(watch)
    try:
        return action()
    except DatabaseError:
        if not statements.first_failed_on_a_dead_connection():
            raise
    finally:
        for connection, watch in watched:
            connection.execute_wrappers.remove(watch)
    return action()


class _Statements:
    """What happened to the statements sent while watched: whether any went through, and the
    database alias of the first that failed."""

    def __init__(self) -> None:
        self.went_through = False
        self.failed_on: str | None = None

    def watch(self, alias: str, execute: Callable[..., Any], *args: Any) -> Any:
        try:
            result = execute(*args)
        except DatabaseError:
            if self.failed_on is None:
                self.failed_on = alias
            raise
        self.went_through = True
        return result

    def first_failed_on_a_dead_connection(self) -> bool:
        """Whether nothing went through and the first statement's connection no longer answers;
        if so it is closed, and the next statement opens a new one."""
        if self.went_through or self.failed_on is None:
            return False
        connection = connections[self.failed_on]
        if connection.connection is None or connection.in_atomic_block:
            return False
        if connection.is_usable():
            return False
        with contextlib.suppress(DatabaseError):
            connection.close()
        return True
