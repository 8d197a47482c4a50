"""Signals for each outcome of a key, cache tier lookup, purge and outbound attempt.

The outcome signals (`BY_OUTCOME`) are sent by views, functions and tasks with ``sender=Attempt``
and the keyword arguments ``request`` (the ``HttpRequest``, None for functions and tasks),
``namespace``, ``owner``, ``key`` and ``duration`` (seconds the store took to decide, None for
``completed`` and ``released``). ``cache_lookup``, ``purged`` and ``outbound_attempt`` carry their
own arguments, below.
Receivers run in the caller's thread: keep them quick. One that raises is logged and never fails
the request, the call or the purge.
"""

from __future__ import annotations

from django.dispatch import Signal

# Every outcome signal is sent on every keyed request or call, always by `Attempt`: its
# receivers are looked up once per sender (until one connects or disconnects), not on each send.

claimed = Signal(use_caching=True)  # This caller owns the key and runs the work.
replayed = Signal(use_caching=True)  # A stored result was returned instead of the work run.
# Another caller holds the key right now (409, or the in-progress error).
conflict = Signal(use_caching=True)
mismatch = Signal(use_caching=True)  # The key was used for a different request or payload (422).
completed = Signal(use_caching=True)  # The result was stored, to be replayed to every retry.
released = Signal(use_caching=True)  # Nothing was stored; the key is free for a retry.

# Every outcome signal by the outcome name the logs and metrics use.
BY_OUTCOME: dict[str, Signal] = {
    "claimed": claimed,
    "replayed": replayed,
    "conflict": conflict,
    "mismatch": mismatch,
    "completed": completed,
    "released": released,
}

# Each lookup of the cache tier, with sender=CacheTier, `hit` (True: the cache answered; False:
# the store did, as the key was not cached, its copy had expired or the cache failed) and
# `namespace`. Sent on every keyed request too, so its receivers are cached as well.
cache_lookup = Signal(use_caching=True)
# Each finished purge, dry runs included, with sender=PurgeReport, `report` (the PurgeReport)
# and `namespace` (the one purged, None for all).
purged = Signal()
# Each attempt of an outbound call (django_idempotency.outbound), with sender=Exchange and
# `key` (None for a request sent without one), `method`, `target` (scheme://host/path), `host`,
# `attempt` (1 for the first), `status` (None when no answer came), `error` (the exception's
# class name, or None), `outcome` (the journal's: "sending" while another attempt follows, then
# "confirmed", "failed" or "ambiguous"), `replayed` and `duration` (seconds the attempt took).
outbound_attempt = Signal()
# Each message the outbox's relay handled, with sender=OutboxMessage, `message` (the
# OutboxMessage as claimed), `outcome` ("sent", "retried", "dead", or "lost": another relay took
# it over first), `error` (why it was not delivered, or None) and `duration` (seconds the
# delivery took).
outbox_delivery = Signal()
