"""The cache tier: completed records copied to a Django cache, so replays need no SQL."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from datetime import datetime

from django.core.cache import caches
from django.core.cache.backends.base import BaseCache

from django_idempotency import signals
from django_idempotency.core.outcomes import Claim, Outcome, Scope, StoredResponse
from django_idempotency.stores.base import (
    ALL_AT_DEFAULTS,
    BaseStore,
    ClaimRequest,
    HeldKey,
    PurgeOptions,
    PurgeResult,
    after_response,
    between_steps,
)

logger = logging.getLogger("django_idempotency")

# ((fingerprint, method, path), expires_at as a POSIX timestamp, status, reason, headers, body)
CachedRecord = tuple[tuple[str, str, str], float, int, str, list[tuple[str, str]], bytes]

# What `forget` leaves where a copy was: a copy still pending (read before the forget, written
# once its response is sent) finds it and writes nothing, instead of bringing the record back.
FORGOTTEN = "forgotten"
# A copy is written within this many seconds of the read it copies, or not at all (the next
# replay copies the record); a tombstone lives twice as long, so it outlives every pending copy.
COPY_WINDOW = 30.0
TOMBSTONE_SECONDS = 2 * COPY_WINDOW


class CacheTier(BaseStore):
    """Wraps the store of record; enabled by IDEMPOTENCY_CACHE = "<cache alias>".

    The wrapped store stays the source of truth for claims. Only completed records are copied
    (after their transaction commits, with their remaining lifetime as the timeout), and any
    cache error is logged and answered from the store instead: the tier can only make a request
    faster, never fail it.
    """

    def __init__(self, inner: BaseStore, alias: str) -> None:
        self.inner = inner
        self.alias = alias

    @property
    def supports_atomic(self) -> bool:  # type: ignore[override]
        return self.inner.supports_atomic

    @property
    def shared_between_processes(self) -> bool:  # type: ignore[override]
        return self.inner.shared_between_processes

    @property
    def cache(self) -> BaseCache:
        return caches[self.alias]

    def now(self) -> datetime:
        return self.inner.now()  # The store of record decides; copies only answer replays.

    def lookup(self, request: ClaimRequest) -> Claim | None:
        try:
            cached: CachedRecord | str | None = self.cache.get(cache_key(request.scope))
        except Exception as exc:  # Any backend, any failure: the store of record answers.
            _warn_quietly("Idempotency cache unavailable, using the store: %s", exc)
            _announce_lookup(request, hit=False)
            return self.inner.lookup(request)  # No copy either: the cache is down.
        # None, a tombstone (FORGOTTEN) or an expired copy: the store of record answers.
        if not isinstance(cached, tuple) or cached[1] <= request.now.timestamp():
            _announce_lookup(request, hit=False)
            return self._copied(self.inner.lookup(request))
        _announce_lookup(request, hit=True)
        identity, _, status, reason, headers, body = cached
        if identity != (request.fingerprint, request.method, request.path):
            return Claim(Outcome.MISMATCH)
        return Claim(Outcome.REPLAY, response=StoredResponse(status, headers, body, reason))

    def read(self, scope: Scope) -> HeldKey | None:
        """The store of record's: the cache keeps completed records only."""
        return self.inner.read(scope)

    def begin(self, request: ClaimRequest) -> Claim:
        claim = self._copied(self.inner.begin(request))
        assert claim is not None
        return claim

    def _copied(self, claim: Claim | None) -> Claim | None:
        """A replay found in the store but not the cache (evicted, or completed before the
        tier existed) is copied, so the next retry is served from the cache."""
        if claim is not None and claim.outcome is Outcome.REPLAY and claim.response is not None:
            stored, read_at = claim.response, time.monotonic()
            after_response(lambda: self._keep(claim, stored, read_at))
        return claim

    def complete(self, claim: Claim, response: StoredResponse, now: datetime) -> bool:
        return self._copy_once_kept(self.inner.complete(claim, response, now), claim, response)

    def complete_last(self, claim: Claim, response: StoredResponse, now: datetime) -> bool:
        kept = self.inner.complete_last(claim, response, now)
        return self._copy_once_kept(kept, claim, response)

    def _copy_once_kept(self, kept: bool, claim: Claim, response: StoredResponse) -> bool:
        if kept:
            # Once committed (a replay then finds it), and past the response: no answer waits.
            written_at = time.monotonic()
            self.inner.after_commit(
                lambda: after_response(lambda: self._keep(claim, response, written_at))
            )
        return kept

    def release(self, claim: Claim) -> bool:
        return self.inner.release(claim)

    def claims_privately(self) -> bool:
        return self.inner.claims_privately()

    def renew(self, claim: Claim, until: datetime) -> bool:
        return self.inner.renew(claim, until)  # In-progress records are never cached.

    def save_steps(
        self, claim: Claim, steps: Mapping[str, bytes], until: datetime | None = None
    ) -> bool:
        return self.inner.save_steps(claim, steps, until)

    def purge(self, now: datetime, options: PurgeOptions = ALL_AT_DEFAULTS) -> PurgeResult:
        forget = options.forget

        # A record expired by the clock has no copy to fear: `_keep` never writes one past
        # its expiry. Only a purge ahead of the clock needs tombstones, and a purge of millions
        # of rows is spared that many keys in the cache.
        tombstones = now > self.inner.now()

        def forget_everywhere(scopes: Iterable[Scope]) -> None:
            scopes = list(scopes)
            self._drop(scopes, tombstones=tombstones)
            self.inner.forget(scopes)
            if forget is not None:
                forget(scopes)

        return self.inner.purge(now, replace(options, forget=forget_everywhere))

    def forget(self, scopes: Iterable[Scope]) -> None:
        """Drop the copies, leaving a short tombstone in their place that a copy still
        pending (its record read before the forget) cannot overwrite."""
        scopes = list(scopes)
        self._drop(scopes, tombstones=True)
        self.inner.forget(scopes)

    def _drop(self, scopes: list[Scope], *, tombstones: bool) -> None:
        keys = [cache_key(scope) for scope in scopes]
        if not keys:
            return
        try:
            if tombstones:
                self.cache.set_many(dict.fromkeys(keys, FORGOTTEN), timeout=TOMBSTONE_SECONDS)
            else:
                self.cache.delete_many(keys)
        except Exception as exc:
            # The copies still expire with their records; log so an operator can flush.
            logger.warning("Could not drop %d idempotency cache entries: %s", len(keys), exc)

    @contextlib.contextmanager
    def atomic(self) -> Iterator[bool]:
        with self.inner.atomic() as owns_transaction:
            yield owns_transaction

    def discard(self) -> None:
        self.inner.discard()

    def after_commit(self, action: Callable[[], None]) -> None:
        self.inner.after_commit(action)

    def _keep(self, claim: Claim, response: StoredResponse, read_at: float) -> None:
        """Copy a record read (or written) at `read_at` (monotonic), unless a `forget` came
        since: `add` writes nothing over its tombstone (or over a copy already there)."""
        if claim.scope is None or claim.fingerprint is None or claim.expires_at is None:
            return
        if time.monotonic() - read_at > COPY_WINDOW:
            return  # Its tombstone may be gone: a later replay copies the record instead.
        expires = claim.expires_at.timestamp()
        timeout = expires - datetime.now(tz=claim.expires_at.tzinfo).timestamp()
        if timeout <= 1:
            return
        value: CachedRecord = (
            (claim.fingerprint, claim.method, claim.path),
            expires,
            response.status,
            response.reason,
            list(response.headers),
            response.body,
        )
        between_steps("copy")
        try:
            self.cache.add(cache_key(claim.scope), value, timeout=int(timeout))
        except Exception as exc:
            _warn_quietly("Could not copy a record to the idempotency cache: %s", exc)


def _announce_lookup(request: ClaimRequest, *, hit: bool) -> None:
    # Every replay passes here. With nothing connected, this check costs a tenth of calling
    # send_robust only to have it return (measured: tens of nanoseconds against a few hundred).
    if signals.cache_lookup.receivers:
        # send_robust: a receiver that raises is logged by Django and never fails the lookup.
        signals.cache_lookup.send_robust(
            sender=CacheTier, hit=hit, namespace=request.scope.namespace
        )


_QUIET_SECONDS = 10.0
_last_warning = [float("-inf")]


def _warn_quietly(message: str, exc: Exception) -> None:
    """A cache outage fails every request's cache call: one warning every few seconds says as
    much as one per request, without flooding the logs while the store answers."""
    now = time.monotonic()
    if now - _last_warning[0] >= _QUIET_SECONDS:
        _last_warning[0] = now
        logger.warning(message, exc)


def cache_key(scope: Scope) -> str:
    """Fixed-length and safe for every backend, whatever characters the key holds."""
    digest = hashlib.sha256("\x00".join((scope.namespace, scope.owner, scope.key)).encode())
    # The version changes with CachedRecord's layout: copies of an older layout are not read.
    return "django_idempotency:2:" + digest.hexdigest()
