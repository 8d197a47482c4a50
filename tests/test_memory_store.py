"""The memory store's purge: it has no TTL of its own, so purging is what frees its memory."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from django_idempotency.core.outcomes import Claim, Outcome, Scope, StoredResponse
from django_idempotency.stores import PurgeResult
from django_idempotency.stores.memory import MemoryStore
from tests.stores import claim_request


def _begin(store: MemoryStore, key: str, *, lease: float, namespace: str = "default") -> Claim:
    claim = store.begin(claim_request(Scope(namespace, "", key), lease=lease))
    assert claim.outcome is Outcome.FRESH
    return claim


def test_purge_frees_expired_records_and_abandoned_claims_only() -> None:
    store = MemoryStore()
    for claim in (_begin(store, "done", lease=60), _begin(store, "r", lease=60, namespace="x")):
        assert store.complete(claim, StoredResponse(201), timezone.now())
    _begin(store, "abandoned", lease=60)
    _begin(store, "running", lease=3 * 3600)  # Past its TTL, but its lease is still live.
    later = timezone.now() + timedelta(hours=2)

    dry_run = store.purge(later, namespace="default", dry_run=True)
    purged = store.purge(later)

    assert dry_run == PurgeResult(expired=1, abandoned=1, batches=0)
    assert purged == PurgeResult(expired=2, abandoned=1, batches=1)
    assert [scope.key for scope in store.records] == ["running"]
