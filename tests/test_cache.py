"""The cache tier on a real Redis: replays with zero SQL, and never a failure of its own."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.cache import caches
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, connection, connections, transaction
from django.http.response import HttpResponseBase
from django.test import Client, RequestFactory, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_idempotency import signals
from django_idempotency.core.outcomes import Scope, StoredResponse
from django_idempotency.models import IdempotencyRecord
from django_idempotency.stores import PurgeOptions, get_store
from django_idempotency.stores import cache as cache_module
from django_idempotency.stores.cache import CachedRecord, cache_key
from tests.models import Charge
from tests.stores import claim_request, the_record, using_store
from tests.utils import asgi_post, assert_problem, clear_own_keys, post, redis_caches

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:63799")
URL = "/viewset/charges/"
SCOPE = Scope("default", "", "key-1")

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]


@pytest.fixture(params=["atomic", "lease"])
def redis_tier(request: pytest.FixtureRequest) -> Iterator[str]:
    with override_settings(
        CACHES=redis_caches(f"{REDIS_URL}/2"),
        IDEMPOTENCY_CACHE="idempotency",
        IDEMPOTENCY_MODE=request.param,
    ):
        clear_own_keys()  # Fails loudly when Redis is not running.
        yield request.param
        clear_own_keys()


@pytest.fixture
def dead_redis() -> Iterator[None]:
    # Nothing listens on port 9: every cache call fails as when Redis is down.
    with override_settings(
        CACHES=redis_caches("redis://127.0.0.1:9/0"), IDEMPOTENCY_CACHE="idempotency"
    ):
        yield


def test_a_replay_is_served_from_the_cache_with_zero_sql(redis_tier: str) -> None:
    client = Client()
    first = post(client, URL)

    with CaptureQueriesContext(connection) as captured:
        retry = post(client, URL)

    assert len(captured) == 0
    assert retry.status_code == 201
    assert retry.content == first.content
    assert retry["Location"] == first["Location"]
    assert retry["Idempotent-Replayed"] == "true"
    assert Charge.objects.count() == 1


def test_a_different_request_with_a_cached_key_is_422_with_zero_sql(redis_tier: str) -> None:
    client = Client()
    post(client, URL)

    with CaptureQueriesContext(connection) as captured:
        response = post(client, URL, {"amount": 99})

    assert_problem(response, 422, "key-reused")
    assert len(captured) == 0


def test_a_cache_miss_replays_from_the_database_and_refills_the_cache(redis_tier: str) -> None:
    client = Client()
    first = post(client, URL)
    clear_own_keys()

    from_database = post(client, URL)
    with CaptureQueriesContext(connection) as captured:
        from_cache = post(client, URL)

    assert from_database.content == from_cache.content == first.content
    assert len(captured) == 0


@pytest.fixture
def served() -> Iterator[Callable[[str], HttpResponseBase]]:
    """POST through Django's WSGI handler as a server does, handing back the response before
    the server closes it (the test client closes it before the test sees it)."""
    handler = WSGIHandler()
    # As the test client does: the test's own connection outlives each request.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)

    def serve(key: str) -> HttpResponseBase:
        request = RequestFactory().post(
            URL,
            json.dumps({"amount": 10}),
            content_type="application/json",
            headers={"Idempotency-Key": key},
        )
        return handler(request.environ, lambda status, headers: None)

    yield serve
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def test_the_copy_to_the_cache_waits_until_the_response_is_sent(
    redis_tier: str, served: Callable[[str], HttpResponseBase]
) -> None:
    response = served("key-1")

    assert response.status_code == 201
    assert IdempotencyRecord.objects.get().response_status == 201  # Committed, replayable.
    assert caches["idempotency"].get(cache_key(SCOPE)) is None  # Not copied while sending.
    response.close()  # The server is done sending it.
    assert caches["idempotency"].get(cache_key(SCOPE)) is not None


def test_a_replay_from_the_database_is_copied_once_it_is_sent(
    redis_tier: str, served: Callable[[str], HttpResponseBase]
) -> None:
    served("key-1").close()
    clear_own_keys()

    replayed = served("key-1")

    assert replayed["Idempotent-Replayed"] == "true"
    assert caches["idempotency"].get(cache_key(SCOPE)) is None
    replayed.close()
    with CaptureQueriesContext(connection) as captured:
        assert post(Client(), URL)["Idempotent-Replayed"] == "true"
    assert len(captured) == 0  # From the copy.


def test_an_async_views_copy_to_the_cache_waits_until_its_response_is_sent(
    redis_tier: str,
) -> None:
    copied_while_sending: list[bool] = []

    async def scenario() -> None:
        body = json.dumps({"amount": 10}).encode()
        scope = asgi_post("/async/charges/", "key-1")
        requests = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> Any:
            if requests:
                return requests.pop()
            # The client stays until it is answered: a future nothing ever resolves.
            return await asyncio.get_running_loop().create_future()

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                copy = await sync_to_async(caches["idempotency"].get)(cache_key(SCOPE))
                copied_while_sending.append(copy is not None)

        await ASGIHandler()(scope, receive, send)
        # The view's queries ran on asgiref's shared sync thread: close its connection.
        await sync_to_async(connections.close_all)()

    asyncio.run(scenario())

    assert copied_while_sending == [False]
    assert IdempotencyRecord.objects.get().response_status == 201
    assert caches["idempotency"].get(cache_key(SCOPE)) is not None  # Once the server closed it.


def test_in_progress_claims_are_never_cached(redis_tier: str) -> None:
    claim = get_store().begin(_claim_request())
    assert claim.record_id is not None

    assert caches["idempotency"].get(cache_key(SCOPE)) is None


def test_released_requests_leave_nothing_in_the_cache(redis_tier: str) -> None:
    post(Client(), URL, outcome="invalid")

    assert caches["idempotency"].get(cache_key(SCOPE)) is None
    assert not IdempotencyRecord.objects.exists()


def test_the_cached_copy_expires_with_its_record(redis_tier: str) -> None:
    with override_settings(IDEMPOTENCY_TTL=timedelta(minutes=5)):
        post(Client(), URL)

    ttl = caches["idempotency"].ttl(cache_key(SCOPE))
    assert 250 < ttl <= 300


def test_purge_removes_cached_copies(redis_tier: str) -> None:
    post(Client(), URL)
    assert caches["idempotency"].get(cache_key(SCOPE)) is not None

    result = get_store().purge(timezone.now() + timedelta(days=2))

    assert result.expired == 1
    assert copy_in("idempotency") is None


def test_redis_down_fails_no_request(dead_redis: None) -> None:
    client = Client()
    first = post(client, URL)
    retry = post(client, URL)
    other = post(client, URL, key="key-2")

    assert first.status_code == other.status_code == 201
    assert retry["Idempotent-Replayed"] == "true"
    assert retry.content == first.content
    assert Charge.objects.count() == 2


def test_redis_down_is_logged_once_not_once_a_request(
    dead_redis: None, caplog: pytest.LogCaptureFixture
) -> None:
    client = Client()
    cache_module._last_warning[0] = float("-inf")  # As in a fresh process.
    with caplog.at_level(logging.WARNING, logger="django_idempotency"):
        for key in ("a", "b", "c", "a", "b"):
            assert post(client, URL, key=key).status_code == 201

    warnings = [r for r in caplog.records if "idempotency cache" in r.getMessage().lower()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]


def test_redis_still_down_after_ten_quiet_seconds_is_logged_again_with_its_error(
    dead_redis: None, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(cache_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    cache_module._last_warning[0] = float("-inf")
    client = Client()
    prefix = "Idempotency cache unavailable, using the store: "
    warned_at: list[float] = []
    with caplog.at_level(logging.WARNING, logger="django_idempotency"):
        for key, now in (("a", 1000.0), ("b", 1009.999), ("c", 1010.0), ("d", 1019.0)):
            clock[0] = now
            before = len(caplog.records)
            assert post(client, URL, key=key).status_code == 201
            if any(r.getMessage().startswith(prefix) for r in caplog.records[before:]):
                warned_at.append(now)

    # At 1000 s, then again exactly 10 s later; not in between, nor within 10 s of the second.
    assert warned_at == [1000.0, 1010.0]
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith(prefix)]
    assert len(warnings) == 2, warnings
    for warning in warnings:
        why = warning.removeprefix(prefix)  # Redis's own error, for the operator.
        assert why and why != "None" and "%s" not in why


def test_purge_with_redis_down_still_purges(dead_redis: None) -> None:
    post(Client(), URL)

    assert get_store().purge(timezone.now() + timedelta(days=2)).expired == 1
    assert not IdempotencyRecord.objects.exists()


def copy_in(alias: str) -> CachedRecord | None:
    """The copy of SCOPE's record in the cache `alias`; a forgotten record's tombstone is none."""
    value = caches[alias].get(cache_key(SCOPE))
    return value if isinstance(value, tuple) else None


def _claim_request() -> object:
    from django_idempotency.stores import ClaimRequest

    return ClaimRequest(
        scope=SCOPE,
        fingerprint="f" * 64,
        method="POST",
        path=URL,
        now=timezone.now(),
        ttl=timedelta(hours=1),
        lease=timedelta(seconds=30),
    )


# The tier in front of the stores that keep no database transaction of their own.


@pytest.fixture(params=["memory", "redis"])
def tier_over_a_store(request: pytest.FixtureRequest) -> Iterator[str]:
    """The cache tier, on its own Redis database, in front of the memory or the Redis store."""
    tier = redis_caches(f"{REDIS_URL}/2")["idempotency"]
    # The second is read once the first applies: the Redis store's CACHES are kept.
    with (
        using_store(request.param),
        override_settings(IDEMPOTENCY_CACHE="tier", CACHES={**settings.CACHES, "tier": tier}),
    ):
        clear_own_keys("tier")
        yield request.param
        clear_own_keys("tier")


def test_a_store_without_transactions_has_its_records_copied_at_once(
    tier_over_a_store: str,
) -> None:
    client = Client()
    hits: list[bool] = []

    def count(sender: object, *, hit: bool, **kwargs: object) -> None:
        hits.append(hit)

    first = post(client, URL)
    copy = caches["tier"].get(cache_key(SCOPE))
    signals.cache_lookup.connect(count)
    try:
        retry = post(client, URL)
    finally:
        signals.cache_lookup.disconnect(count)

    assert copy is not None
    _, _, status, _, _, body = copy  # A CachedRecord.
    assert (status, body) == (201, first.content)
    assert hits == [True]
    assert retry["Idempotent-Replayed"] == "true"
    assert retry.content == first.content
    assert Charge.objects.count() == 1


def test_a_purge_of_the_memory_store_drops_the_copies_too() -> None:
    tier = redis_caches(f"{REDIS_URL}/2")["idempotency"]
    with (
        using_store("memory"),
        override_settings(IDEMPOTENCY_CACHE="tier", CACHES={**settings.CACHES, "tier": tier}),
    ):
        assert post(Client(), URL).status_code == 201
        assert caches["tier"].get(cache_key(SCOPE)) is not None

        assert get_store().purge(timezone.now() + timedelta(days=2)).expired == 1

        assert copy_in("tier") is None  # No copy outlives its record.
        clear_own_keys("tier")


def test_a_response_expiring_within_a_second_is_not_copied(tier_over_a_store: str) -> None:
    with override_settings(IDEMPOTENCY_TTL=timedelta(seconds=1)):
        assert post(Client(), URL).status_code == 201

    assert the_record().response_status == 201
    assert caches["tier"].get(cache_key(SCOPE)) is None


@pytest.mark.usefixtures("redis_tier")
def test_a_claim_that_lost_its_lease_leaves_no_copy_the_winner_does() -> None:
    store = get_store()
    hours_ago = timezone.now() - timedelta(hours=2)
    late = store.begin(replace(claim_request(SCOPE, path=URL), now=hours_ago))
    winner = store.begin(claim_request(SCOPE, path=URL))  # The late claim's lease ran out.

    assert not store.complete(late, StoredResponse(201, [], b"late"), timezone.now())
    assert caches["idempotency"].get(cache_key(SCOPE)) is None
    assert store.complete(winner, StoredResponse(201, [], b"winner"), timezone.now())
    *_, body = caches["idempotency"].get(cache_key(SCOPE))
    assert body == b"winner"


@pytest.mark.usefixtures("redis_tier")
def test_a_purge_drops_the_copies_and_passes_the_scopes_to_the_callers_forget() -> None:
    post(Client(), URL)
    post(Client(), URL, key="key-2")
    forgotten: list[Scope] = []

    result = get_store().purge(
        timezone.now() + timedelta(days=2), PurgeOptions(forget=forgotten.extend)
    )

    assert result.expired == 2
    assert sorted(scope.key for scope in forgotten) == ["key-1", "key-2"]
    assert copy_in("idempotency") is None


@pytest.mark.usefixtures("redis_tier")
def test_work_after_commit_waits_for_the_records_transaction() -> None:
    ran: list[str] = []

    with transaction.atomic():
        get_store().after_commit(lambda: ran.append("after commit"))
        assert ran == []

    assert ran == ["after commit"]


def test_a_forget_before_the_replays_copy_is_never_undone_by_the_copy(
    redis_tier: str, served: Callable[[str], HttpResponseBase]
) -> None:
    served("key-1").close()
    clear_own_keys()  # The record only in the database, as after an eviction.
    replayed = served("key-1")  # Read from the database; its copy waits for the close.
    assert replayed["Idempotent-Replayed"] == "true"

    # The admin's "delete and forget", between the read and the copy.
    IdempotencyRecord.objects.all().delete()
    get_store().forget([SCOPE])
    replayed.close()

    again = post(Client(), URL)  # A copy written by the close would replay here.
    assert again.status_code == 201
    assert "Idempotent-Replayed" not in again  # Fresh: the view ran again.
    assert Charge.objects.count() == 2


@pytest.mark.usefixtures("redis_tier")
def test_a_forget_leaves_a_tombstone_a_purge_by_the_clock_only_deletes() -> None:
    store = get_store()
    post(Client(), URL)

    store.forget([SCOPE])
    tombstone_ttl = caches["idempotency"].ttl(cache_key(SCOPE))
    IdempotencyRecord.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    # What has expired by now, on the store's clock (the purge's): `_keep` writes no copy of
    # it, so none can be pending.
    assert store.purge(store.now()).expired == 1

    assert copy_in("idempotency") is None
    assert 0 < tombstone_ttl <= cache_module.TOMBSTONE_SECONDS
    assert caches["idempotency"].get(cache_key(SCOPE)) is None  # Deleted, no tombstone.
