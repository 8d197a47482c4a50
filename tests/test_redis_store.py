"""The Redis store on a real Redis: its key layout, expiry by Redis TTL, and Redis down."""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, override_settings
from django.utils import timezone

from django_idempotency.attempts import Attempt
from django_idempotency.core.outcomes import Outcome, Scope, StoredResponse
from django_idempotency.stores import StoreUnavailable, get_store
from django_idempotency.stores.redis import TAKE_OVER, RedisStore
from tests.models import Charge
from tests.stores import (
    REDIS_URL,
    claim_request,
    redis_keys,
    redis_settings,
    the_record,
    using_store,
)
from tests.utils import ViewKind, assert_problem, post

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]

URL = "/function/charges/"
SCOPE = Scope("default", "", "key-1")
DEAD = "redis://127.0.0.1:9/0"  # Nothing listens there: every call fails as with Redis down.


@pytest.fixture
def redis_store() -> Iterator[RedisStore]:
    with using_store("redis"):
        store = get_store()
        assert isinstance(store, RedisStore)
        yield store


@pytest.fixture
def redis_down() -> Iterator[None]:
    with override_settings(**redis_settings(DEAD)):
        yield


def test_each_record_is_one_hash_whose_key_hash_tags_the_scope(redis_store: RedisStore) -> None:
    post(Client(), URL)

    connection = redis_store.connection()
    [key] = redis_keys(redis_store)
    digest = hashlib.sha256(b"default\x00\x00key-1").hexdigest()
    assert re.fullmatch(rf"tests-\d+:django_idempotency:1:\{{{digest}\}}", key.decode())
    fields = {name.decode() for name in connection.hgetall(key)}
    assert fields == {
        *("namespace", "owner", "key", "fingerprint", "method", "path", "status"),
        *("lease_token", "created_at", "expires_at", "completed_at"),
        *("response_status", "response_reason", "response_headers", "response_body"),
    }


def test_a_completed_record_expires_with_its_ttl_in_redis(redis_store: RedisStore) -> None:
    with override_settings(IDEMPOTENCY_TTL=timedelta(minutes=5)):
        post(Client(), URL)

    [key] = redis_keys(redis_store)
    expires_at = the_record().expires_at.timestamp() * 1000
    assert abs(redis_store.connection().pexpiretime(key) - expires_at) <= 1


def test_a_claim_outlives_a_ttl_shorter_than_its_lease(redis_store: RedisStore) -> None:
    claim = redis_store.begin(claim_request(ttl=5, lease=60))

    [key] = redis_keys(redis_store)
    assert claim.lease_expires_at is not None
    lease_end = claim.lease_expires_at.timestamp() * 1000
    assert abs(redis_store.connection().pexpiretime(key) - lease_end) <= 1
    # Past its TTL but within its lease, the claim still holds the key.
    later = replace(claim_request(), now=timezone.now() + timedelta(seconds=10))
    assert redis_store.begin(later).outcome is Outcome.IN_PROGRESS


def test_purge_deletes_nothing_and_says_so(
    redis_store: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    first = post(Client(), URL)

    with caplog.at_level(logging.INFO, logger="django_idempotency"):
        result = redis_store.purge(timezone.now() + timedelta(days=2))

    assert (result.total, result.batches) == (0, 0)
    assert [r.getMessage() for r in caplog.records if r.name == "django_idempotency"] == [
        "The Redis store's records expire by Redis TTL: the purge deletes nothing."
    ]
    assert post(Client(), URL).content == first.content


@pytest.mark.parametrize(
    "view_kind",
    [ViewKind.FUNCTION, ViewKind.VIEWSET_MIXIN, ViewKind.ASYNC_FUNCTION],
    ids=lambda kind: kind.name.lower(),
)
def test_redis_down_is_503_and_the_view_does_not_run(redis_down: None, view_kind: ViewKind) -> None:
    response = post(Client(), view_kind.url)

    assert_problem(response, 503, "store-unavailable")
    assert response["Retry-After"]
    assert Charge.objects.count() == 0


def test_redis_lost_after_the_claim_keeps_the_key_until_the_lease_ends(
    redis_store: RedisStore,
) -> None:
    attempt = Attempt(atomic=False, on_conflict="reject")
    assert attempt.begin(claim_request(lease=0.3)).outcome is Outcome.FRESH

    with override_settings(**redis_settings(DEAD)), pytest.raises(StoreUnavailable):
        attempt.complete(StoredResponse(201, [], b"lost"))

    # Not stored and not released: the claim ends with its lease, never with a second run.
    assert the_record().status == "in_progress"


def test_a_redis_cache_alias_that_is_not_django_redis_fails_the_request_naming_it() -> None:
    # `manage.py check` reports it as E019; a project that ran without checks finds out here.
    locmem = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    with (
        override_settings(
            **{**redis_settings(), "CACHES": {"default": locmem, "idempotency": locmem}}
        ),
        pytest.raises(ImproperlyConfigured) as error,
    ):
        post(Client(), URL)

    assert str(error.value) == (
        "IDEMPOTENCY_REDIS_CACHE = 'idempotency' is not a django-redis cache: the Redis store"
        " needs its connection (BACKEND django_redis.cache.RedisCache)."
    )
    assert Charge.objects.count() == 0


def test_without_a_key_prefix_a_records_key_is_the_documented_layout_alone() -> None:
    settings = redis_settings()
    settings["CACHES"]["idempotency"]["KEY_PREFIX"] = ""
    with override_settings(**settings):
        key = RedisStore().record_key(SCOPE)

    digest = hashlib.sha256(b"default\x00\x00key-1").hexdigest()
    assert key == f"django_idempotency:1:{{{digest}}}"


def test_redis_down_is_logged_with_the_alias_and_redis_error(
    redis_down: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="django_idempotency"):
        assert_problem(post(Client(), URL), 503, "store-unavailable")

    [message] = [r.getMessage() for r in caplog.records if r.name == "django_idempotency"]
    assert message.startswith("Idempotency store unreachable: Redis ('idempotency'): ")
    assert "Connection refused" in message or "Error" in message


class RacedRedisStore(RedisStore):
    """A Redis store whose take-over meets a rival retry that took the key over first (for
    real, on the same Redis), between reading the abandoned claim and taking it over."""

    def __init__(self, later: Any) -> None:
        super().__init__()
        self.later = later

    def _run(self, source: str, key: str, args: Any) -> Any:
        if source is TAKE_OVER:
            rival = RedisStore().begin(replace(claim_request(), now=self.later))
            assert rival.outcome is Outcome.FRESH
        return super()._run(source, key, args)


def test_a_take_over_lost_to_a_rival_retry_is_in_progress(redis_store: RedisStore) -> None:
    redis_store.begin(claim_request(lease=1))  # Its request died; the lease ends in a second.
    later = timezone.now() + timedelta(seconds=2)

    lost = RacedRedisStore(later).begin(replace(claim_request(), now=later))

    assert lost.outcome is Outcome.IN_PROGRESS
    assert the_record().status == "in_progress"  # The rival's claim, running.


def test_with_a_replica_configured_records_are_written_and_read_on_the_primary() -> None:
    # django-redis sends reads to a replica (every LOCATION after the first) unless asked for
    # the primary: a claim read from a lagging replica would miss the rival's claim. Database 4
    # of the same server stands in for the replica here.
    primary, replica = f"{REDIS_URL}/3", f"{REDIS_URL}/4"
    settings = redis_settings()
    settings["CACHES"]["idempotency"]["LOCATION"] = [primary, replica]
    with override_settings(**settings):
        store = get_store()
        assert isinstance(store, RedisStore)
        key = store.record_key(SCOPE)
        try:
            first = post(Client(), URL, {"amount": 5})
            retry = post(Client(), URL, {"amount": 5})
            on = {url: redis.Redis.from_url(url).exists(key) for url in (primary, replica)}
        finally:
            for url in (primary, replica):
                redis.Redis.from_url(url).delete(key)

    assert (first.status_code, retry["Idempotent-Replayed"]) == (201, "true")
    assert on == {primary: 1, replica: 0}
    assert Charge.objects.count() == 1
