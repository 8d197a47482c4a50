"""The memory store's purge: it has no TTL of its own, so purging is what frees its memory."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from io import StringIO

from django.core.management import call_command
from django.utils import timezone

from django_idempotency.core.outcomes import Claim, Outcome, Scope, StoredResponse
from django_idempotency.stores import PurgeOptions, PurgeResult, get_store
from django_idempotency.stores.memory import MemoryStore
from tests.stores import claim_request, using_store


def _begin(store: MemoryStore, key: str, *, lease: float, namespace: str = "default") -> Claim:
    claim = store.begin(claim_request(Scope(namespace, "", key), lease=lease))
    assert claim.outcome is Outcome.FRESH
    return claim


def test_purge_frees_expired_records_and_abandoned_claims_only() -> None:
    store = MemoryStore()
    for claim in (_begin(store, "done", lease=60), _begin(store, "r", lease=60, namespace="x")):
        assert store.complete(claim, StoredResponse(201), timezone.now())
    _begin(store, "abandoned", lease=60)
    _begin(store, "abandoned too", lease=60)
    _begin(store, "running", lease=3 * 3600)  # Past its TTL, but its lease is still live.
    later = timezone.now() + timedelta(hours=2)

    dry_run = store.purge(later, PurgeOptions(namespace="default", dry_run=True))
    purged = store.purge(later)

    assert dry_run == PurgeResult(expired=1, abandoned=2, batches=0)
    assert purged == PurgeResult(expired=2, abandoned=2, batches=1)
    assert [scope.key for scope in store.records] == ["running"]


def test_the_purge_command_frees_the_memory_store_in_one_batch_and_reports_it() -> None:
    two_hours_ago = timezone.now() - timedelta(hours=2)  # Claims of an hour's TTL, expired.
    with using_store("memory"):
        store = get_store()
        assert isinstance(store, MemoryStore)
        done, _ = (
            store.begin(replace(claim_request(Scope("default", "", key)), now=two_hours_ago))
            for key in ("done", "abandoned")
        )
        assert store.complete(done, StoredResponse(201), two_hours_ago)
        _begin(store, "running", lease=60)
        stdout = StringIO()

        call_command("idempotency_purge", "--batch-size", "1", verbosity=2, stdout=stdout)

        batch, summary = stdout.getvalue().splitlines()
        # The memory store frees everything at once, whatever the batch size: one batch.
        assert batch == "Batch 1: 2 records purged so far (1 expired, 1 abandoned)."
        assert summary.startswith("Purged 2 records (1 expired, 1 abandoned) in ")
        assert [scope.key for scope in store.records] == ["running"]
