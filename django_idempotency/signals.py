"""Signals sent as a key is claimed, replayed, refused or released, by views, functions and tasks.

Every signal is sent with ``sender=Attempt`` and the keyword arguments ``request`` (the
``HttpRequest``, None for functions and tasks), ``namespace``, ``owner``, ``key`` and ``duration``
(seconds the store took to decide, None for ``completed`` and ``released``). Receivers run in the
request's thread: keep them quick. One that raises is logged and never fails the request.
"""

from __future__ import annotations

from django.dispatch import Signal

claimed = Signal()  # This caller owns the key now and runs the work.
replayed = Signal()  # A stored result was returned instead of running the work.
conflict = Signal()  # Another caller holds the key right now (409, or the in-progress error).
mismatch = Signal()  # The key was used for a different request or payload (422).
completed = Signal()  # The result was stored and will be replayed to every retry.
released = Signal()  # Nothing was stored; the key is free for a retry.

# Every signal by the outcome name the logs and metrics use.
BY_OUTCOME: dict[str, Signal] = {
    "claimed": claimed,
    "replayed": replayed,
    "conflict": conflict,
    "mismatch": mismatch,
    "completed": completed,
    "released": released,
}
