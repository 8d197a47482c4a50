"""The Redis store on a real Redis: its key layout, expiry by Redis TTL, and Redis down."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import logging
import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, override_settings
from django.utils import timezone

from django_idempotency import threads
from django_idempotency.attempts import Attempt
from django_idempotency.core.keys import key_hash
from django_idempotency.core.outcomes import Outcome, Scope, StoredResponse
from django_idempotency.stores import ClaimRequest, StoreUnavailable, get_store
from django_idempotency.stores.base import interleave
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
from tests.utils import REDIS_CLUSTER_URL, ViewKind, assert_problem, fingerprint_of, post

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]

URL = "/function/charges/"
SCOPE = Scope("default", "", "key-1")
DEAD = "redis://127.0.0.1:9/0"  # Nothing listens there: every call fails as with Redis down.
# A key's expiry is set relative to when its script runs, on Redis's clock: the record's own
# expiry, late by the time between the request's `now` and its script (well under a second).
LATE = 1000
# Milliseconds a reading of Redis's clock may be off by (half its round trip, on a busy machine).
READ_WITHIN = 50


@pytest.fixture
def redis_down() -> Iterator[None]:
    with override_settings(**redis_settings(DEAD)):
        yield


def test_each_record_is_one_hash_whose_key_hash_tags_the_scope(redis_store: RedisStore) -> None:
    post(Client(), URL)

    connection = redis_store.connection()
    [key] = redis_keys(redis_store)
    digest = hashlib.sha256(b"default\x00\x00key-1").hexdigest()
    assert re.fullmatch(rf"tests-\d+(-db\d)?:1:django_idempotency:1:\{{{digest}\}}", key.decode())
    fields = {name.decode() for name in connection.hgetall(key)}
    assert fields == {
        *("namespace", "owner", "key", "fingerprint", "method", "path", "status"),
        *("lease_token", "created_at", "expires_at", "completed_at", "operation"),
        *("response_status", "response_reason", "response_headers", "response_body"),
    }


def test_a_completed_record_expires_with_its_ttl_in_redis(redis_store: RedisStore) -> None:
    with override_settings(IDEMPOTENCY_TTL=timedelta(minutes=5)):
        post(Client(), URL)

    [key] = redis_keys(redis_store)
    expires_at = the_record().expires_at.timestamp() * 1000
    # The record's end is on the store's clock: Redis's, read within half a round trip.
    assert -READ_WITHIN <= redis_store.connection().pexpiretime(key) - expires_at <= LATE


def test_a_claim_outlives_a_ttl_shorter_than_its_lease(redis_store: RedisStore) -> None:
    claim = redis_store.begin(claim_request(ttl=5, lease=60))

    [key] = redis_keys(redis_store)
    assert claim.lease_expires_at is not None
    lease_end = claim.lease_expires_at.timestamp() * 1000
    assert -1 <= redis_store.connection().pexpiretime(key) - lease_end <= LATE
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
    # Django's default key function, <KEY_PREFIX>:<VERSION>:<key>, as for the cache's own keys.
    assert key == f":1:django_idempotency:1:{{{digest}}}"


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


# A cluster's replicas are its own, not django-redis LOCATIONs.
@pytest.mark.single_node_redis
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


def leased_out(request: ClaimRequest) -> ClaimRequest:
    """`request` made two seconds ago with a lease of one: its lease ran out a second ago."""
    return replace(request, now=request.now - timedelta(seconds=2), lease=timedelta(seconds=1))


def test_a_take_over_meeting_a_late_completion_replays_it_and_the_view_does_not_run(
    redis_store: RedisStore,
) -> None:
    # The first request's lease ran out a second ago, but its request is only slow: it
    # completes after the retry read its claim as abandoned, before the retry takes it over.
    body = {"amount": 10}
    original = redis_store.begin(leased_out(claim_request(fingerprint=fingerprint_of(URL, body))))
    stored = StoredResponse(201, [("Content-Type", "application/json")], b'{"id": "original"}')
    completed = []

    def original_completes() -> None:
        completed.append(redis_store.complete(original, stored, timezone.now()))

    with interleave({"take-over": original_completes}):
        retry = post(Client(), URL, body)

    assert completed == [True]
    assert (retry.status_code, retry["Idempotent-Replayed"]) == (201, "true")
    assert retry.content == b'{"id": "original"}'
    assert Charge.objects.count() == 0  # The view did not run a second time.
    assert (the_record().status, the_record().response_body) == ("completed", stored.body)


@pytest.mark.parametrize(
    ("fingerprint", "outcome"),
    [("f" * 64, Outcome.REPLAY), ("0" * 64, Outcome.MISMATCH)],
    ids=["same-request", "other-request"],
)
def test_a_take_over_answers_what_a_record_completed_meanwhile_means(
    redis_store: RedisStore, fingerprint: str, outcome: Outcome
) -> None:
    original = redis_store.begin(claim_request(lease=1))
    later = replace(
        claim_request(fingerprint=fingerprint), now=timezone.now() + timedelta(seconds=2)
    )

    def original_completes() -> None:
        assert redis_store.complete(original, StoredResponse(201, [], b"done"), later.now)

    with interleave({"take-over": original_completes}):
        claim = redis_store.begin(later)

    assert claim.outcome is outcome
    replayed = StoredResponse(201, [], b"done") if outcome is Outcome.REPLAY else None
    assert claim.response == replayed
    assert (the_record().status, the_record().response_body) == ("completed", b"done")


def test_a_take_over_of_a_claim_released_meanwhile_claims_the_free_key(
    redis_store: RedisStore,
) -> None:
    original = redis_store.begin(leased_out(claim_request()))

    with interleave({"take-over": lambda: redis_store.release(original)}):
        retry = redis_store.begin(claim_request())

    assert retry.outcome is Outcome.FRESH
    assert the_record().status == "in_progress"
    assert redis_store.complete(retry, StoredResponse(201, [], b"retry"), timezone.now())


def in_the_repeated_hour(seconds: int = 0) -> datetime:
    """Paris's local time in the hour that repeats when its clocks go back (fold=1: the second
    02:30), as `timezone.now()` gives it with USE_TZ = False."""
    return datetime(2026, 10, 25, 2, 30, seconds, fold=1)


@pytest.fixture
def naive_paris_time() -> Iterator[None]:
    with override_settings(USE_TZ=False, TIME_ZONE="Europe/Paris"):
        yield


def test_use_tz_false_a_claim_in_the_repeated_hour_holds_its_key(
    redis_store: RedisStore, naive_paris_time: None
) -> None:
    # `now + ttl` and `now + lease` land in the first 02:30-02:40, an hour before `now` if
    # read as local times: the claim must still hold the key for its lease and its TTL.
    first = replace(claim_request(ttl=600, lease=60), now=in_the_repeated_hour())
    claim = redis_store.begin(first)

    [key] = redis_keys(redis_store)
    assert 0 < redis_store.connection().pttl(key) <= 600_000
    retry = replace(first, now=in_the_repeated_hour(10))
    assert redis_store.begin(retry).outcome is Outcome.IN_PROGRESS
    assert redis_store.complete(claim, StoredResponse(201, [], b"done"), in_the_repeated_hour(20))
    assert 0 < redis_store.connection().pttl(key) <= 580_000
    replay = redis_store.begin(replace(first, now=in_the_repeated_hour(30)))
    assert (replay.outcome, replay.response) == (Outcome.REPLAY, StoredResponse(201, [], b"done"))


def test_use_tz_false_a_retry_in_the_repeated_hour_is_replayed(
    redis_store: RedisStore, naive_paris_time: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(timezone, "now", in_the_repeated_hour)
    monkeypatch.setattr(redis_store, "now", in_the_repeated_hour)  # The clock claims are on.

    with override_settings(IDEMPOTENCY_TTL=timedelta(minutes=10)):
        first = post(Client(), URL)
        retry = post(Client(), URL)

    assert (first.status_code, retry.status_code, retry["Idempotent-Replayed"]) == (
        201,
        201,
        "true",
    )
    assert retry.content == first.content
    assert Charge.objects.count() == 1


@contextlib.contextmanager
def maxmemory_policy(policy: str) -> Iterator[None]:
    """The test Redis with `policy` for the block, then its own again. Its maxmemory is 0 (no
    limit), so nothing is evicted meanwhile, whatever the policy.

    On a Redis Cluster, the last of its primaries alone: one that evicts is one too many, and
    it is not the node a client asks what it asks no node in particular."""
    if REDIS_CLUSTER_URL:
        cluster = redis.RedisCluster.from_url(REDIS_CLUSTER_URL)
        primary = max(cluster.get_primaries(), key=lambda node: node.port)
        server = redis.Redis(host=primary.host, port=primary.port)
        cluster.close()
    else:
        server = redis.Redis.from_url(REDIS_URL)
    original = server.config_get("maxmemory-policy")["maxmemory-policy"]
    server.config_set("maxmemory-policy", policy)
    try:
        yield
    finally:
        server.config_set("maxmemory-policy", original)
        server.close()


def logged(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "django_idempotency" and r.levelno == level
    ]


@pytest.mark.parametrize("policy", ["volatile-lru", "allkeys-lfu"])
def test_a_redis_that_may_evict_claims_is_warned_about_once_at_first_use(
    policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        maxmemory_policy(policy),
        using_store("redis"),
        caplog.at_level(logging.WARNING, logger="django_idempotency"),
    ):
        first = post(Client(), URL)
        retry = post(Client(), URL)

    assert (first.status_code, retry["Idempotent-Replayed"]) == (201, "true")
    assert logged(caplog, logging.WARNING) == [
        f"The Redis of IDEMPOTENCY_REDIS_CACHE = 'idempotency' evicts keys when its memory is"
        f" full (maxmemory-policy {policy}): a claim it evicts lets a retry run the view again."
        " Set maxmemory-policy noeviction on that Redis."
    ]


def test_a_redis_that_never_evicts_is_not_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    with (
        maxmemory_policy("noeviction"),
        using_store("redis"),
        caplog.at_level(logging.DEBUG, logger="django_idempotency"),
    ):
        post(Client(), URL)

    assert logged(caplog, logging.WARNING) == []


@pytest.fixture
def redis_refusing_config() -> Iterator[str]:
    """A Redis of this test's own whose CONFIG command is gone, as on managed Redis services."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [
            *("redis-server", "--port", str(port), "--bind", "127.0.0.1"),
            *("--save", "", "--appendonly", "no", "--rename-command", "CONFIG", ""),
        ],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port, socket_timeout=1)
    try:
        deadline = time.monotonic() + 10
        while True:  # Until it accepts connections: started, not raced.
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert server.poll() is None and time.monotonic() < deadline, "no redis-server"
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        client.close()
        server.terminate()
        server.wait(timeout=10)


@pytest.mark.single_node_redis  # A Redis of the test's own, not a cluster.
def test_a_redis_that_refuses_config_is_used_and_said_so_at_debug_level(
    redis_refusing_config: str, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        override_settings(**redis_settings(redis_refusing_config)),
        caplog.at_level(logging.DEBUG, logger="django_idempotency"),
    ):
        first = post(Client(), URL)
        retry = post(Client(), URL)

    assert (first.status_code, retry["Idempotent-Replayed"]) == (201, "true")
    assert logged(caplog, logging.WARNING) == []
    [message] = [m for m in logged(caplog, logging.DEBUG) if "maxmemory-policy" in m]
    assert message.startswith(
        "Could not read the maxmemory-policy of the Redis of IDEMPOTENCY_REDIS_CACHE ="
        " 'idempotency' (make sure it is noeviction): "
    )


def tenant_b_key(key: str, key_prefix: str, version: int) -> str:
    """A KEY_FUNCTION that puts a tenant's name first, as django-tenants does."""
    return f"tenant-b:{key_prefix}:{version}:{key}"


@pytest.mark.parametrize(
    "other",
    [{"VERSION": 2}, {"KEY_FUNCTION": "tests.test_redis_store.tenant_b_key"}],
    ids=["version", "key-function"],
)
def test_caches_apart_by_version_or_key_function_keep_their_records_apart(
    other: dict[str, Any],
) -> None:
    settings = redis_settings()
    caches = settings["CACHES"]
    caches["tenant-b"] = {**caches["idempotency"], **other}
    with override_settings(**settings):
        tenant_a = RedisStore()
        with override_settings(IDEMPOTENCY_REDIS_CACHE="tenant-b"):
            tenant_b = RedisStore()
            key_b = tenant_b.record_key(SCOPE)
        key_a = tenant_a.record_key(SCOPE)
        try:
            a = tenant_a.begin(claim_request())
            with override_settings(IDEMPOTENCY_REDIS_CACHE="tenant-b"):
                b = tenant_b.begin(claim_request())
        finally:
            tenant_a.connection().delete(key_a, key_b)

    assert (a.outcome, b.outcome) == (Outcome.FRESH, Outcome.FRESH)
    assert key_a != key_b
    assert re.fullmatch(r"\{[0-9a-f]{64}\}", key_b[key_b.index("{") :])


# More replicas than the test Redis has: none on one Redis, one per primary on the cluster.
TOO_MANY_REPLICAS = 2 if REDIS_CLUSTER_URL else 1
SHORT_WAIT = 0.05


def test_a_claim_too_few_replicas_acknowledged_is_503_given_back_and_the_view_does_not_run(
    redis_store: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        override_settings(
            IDEMPOTENCY_REDIS_WAIT_REPLICAS=TOO_MANY_REPLICAS,
            IDEMPOTENCY_REDIS_WAIT_TIMEOUT=SHORT_WAIT,
        ),
        caplog.at_level(logging.ERROR, logger="django_idempotency"),
    ):
        refused = post(Client(), URL, {"amount": 5})

    assert_problem(refused, 503, "store-unavailable")
    assert Charge.objects.count() == 0
    assert redis_keys(redis_store) == []  # Given back: a retry is not held off by it (409).
    [message] = logged(caplog, logging.ERROR)
    assert message == (
        "Idempotency store unreachable: Redis ('idempotency'): the claim reached"
        f" {TOO_MANY_REPLICAS - 1} of the {TOO_MANY_REPLICAS} replicas"
        " IDEMPOTENCY_REDIS_WAIT_REPLICAS asks for within 0.05 s; the request is refused rather"
        " than run unprotected. Check the replicas' links (INFO replication)."
    )
    retry = post(Client(), URL, {"amount": 5})
    assert (retry.status_code, Charge.objects.count()) == (201, 1)


def test_a_response_too_few_replicas_acknowledged_is_stored_sent_and_logged(
    redis_store: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    claim = redis_store.begin(claim_request())
    with (
        override_settings(
            IDEMPOTENCY_REDIS_WAIT_REPLICAS=TOO_MANY_REPLICAS,
            IDEMPOTENCY_REDIS_WAIT_TIMEOUT=SHORT_WAIT,
        ),
        caplog.at_level(logging.WARNING, logger="django_idempotency"),
    ):
        kept = redis_store.complete(
            claim, StoredResponse(201, [], b"{}", "Created"), timezone.now()
        )

    assert kept
    assert (the_record().status, the_record().response_body) == ("completed", b"{}")
    # The key's hash, as every other log line: a client's key may carry its data.
    assert not [r for r in caplog.records if SCOPE.key in r.getMessage()]
    assert logged(caplog, logging.WARNING) == [
        f"The stored response of key_hash={key_hash(SCOPE.key)} reached {TOO_MANY_REPLICAS - 1}"
        f" of the {TOO_MANY_REPLICAS} replicas IDEMPOTENCY_REDIS_WAIT_REPLICAS asks for within"
        " 0.05 s: it is sent, but a fail-over of its primary before they catch up loses it, and a"
        " retry runs the view again once the lease ends."
    ]


def test_a_resume_too_few_replicas_acknowledged_keeps_the_operation_for_the_next_retry(
    redis_store: RedisStore,
) -> None:
    crashed = redis_store.begin(replace(claim_request(), now=timezone.now() - timedelta(hours=1)))
    assert redis_store.save_steps(crashed, {"charge": b"1"})  # Then its worker died.
    with (
        override_settings(
            IDEMPOTENCY_REDIS_WAIT_REPLICAS=TOO_MANY_REPLICAS,
            IDEMPOTENCY_REDIS_WAIT_TIMEOUT=SHORT_WAIT,
        ),
        pytest.raises(StoreUnavailable),
    ):
        redis_store.begin(claim_request())  # Resumed, then refused: given back.

    retry = redis_store.begin(claim_request())

    # Given back by ending its lease, not by deleting the record: the operation goes on.
    assert retry.outcome is Outcome.FRESH
    assert (retry.operation_id, retry.steps) == (crashed.operation_id, {"charge": b"1"})


@pytest.mark.redis_cluster_nodes  # Replicas to wait for.
def test_waiting_for_a_replica_the_stored_response_is_on_it_when_the_client_gets_it(
    redis_store: RedisStore,
) -> None:
    key = redis_store.record_key(SCOPE)
    connection = redis_store.connection()
    assert isinstance(connection, redis.RedisCluster)
    # The client's slot map may date from before the replicas joined a new cluster: read it
    # again, to find the replica to look at.
    connection.nodes_manager.initialize()
    node = connection.get_node_from_key(key, replica=True)
    replica = redis.Redis(host=node.host, port=node.port, single_connection_client=True)
    replica.execute_command("READONLY")  # A replica of a cluster answers reads only after it.
    try:
        with override_settings(IDEMPOTENCY_REDIS_WAIT_REPLICAS=1):
            first = post(Client(), URL, {"amount": 5})
            on_replica = replica.hget(key, "response_body")
            retry = post(Client(), URL, {"amount": 5})
    finally:
        replica.close()

    assert (first.status_code, retry["Idempotent-Replayed"]) == (201, "true")
    assert on_replica == first.content
    assert Charge.objects.count() == 1


def test_a_redis_cluster_location_naming_a_database_says_to_use_key_prefix() -> None:
    # Refused before any connection is made: no cluster is needed to see it.
    from django.conf import settings
    from django.core.cache import caches

    location = "redis://127.0.0.1:63799/2"
    cluster_alias = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": location,
        "OPTIONS": {"CLIENT_CLASS": "django_idempotency.contrib.redis_cluster.RedisClusterClient"},
    }
    with (
        override_settings(CACHES={**settings.CACHES, "cluster": cluster_alias}),
        pytest.raises(ImproperlyConfigured) as error,
    ):
        caches["cluster"].get("anything")

    assert str(error.value) == (
        f"{location!r}: a Redis Cluster has database 0 only. Drop the /2 from the LOCATION and"
        " keep caches apart with KEY_PREFIX instead."
    )


def test_under_gevent_the_heartbeats_native_thread_renews_through_a_client_of_its_own(
    redis_store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As under gevent, in this process (which gevent did not patch: it hands back the functions
    # it would have saved). tests/test_leases_gevent.py serves it under a real gevent worker.
    importlib.import_module("gevent.monkey")
    monkeypatch.setattr(threads, "green", lambda: "gevent")
    claim = redis_store.begin(claim_request(lease=1))
    shared = redis_store.connection()
    seen: dict[str, Any] = {}
    done = threading.Event()

    def renew_natively() -> None:
        try:
            seen["clients"] = [redis_store.connection(), redis_store.connection()]
            seen["renewed"] = redis_store.renew(claim, redis_store.now() + timedelta(minutes=5))
        finally:
            done.set()

    threads.start_thread(renew_natively, "heartbeat", native=True)
    assert done.wait(30)

    first, second = seen["clients"]
    assert first is second  # Made once per thread.
    assert first is not shared
    assert _pools(first).isdisjoint(_pools(shared))  # No socket of the greenlets' pools.
    assert seen["renewed"]
    [key] = redis_keys(redis_store)
    lease_ends = int(shared.hget(key, "lease_expires_at")) / 1000
    assert lease_ends > (timezone.now() + timedelta(minutes=4)).timestamp()
    assert redis_store.connection() is shared  # The other threads' client is django-redis's.


def _pools(client: Any) -> set[int]:
    """The ids of a client's connection pools (a Redis Cluster's: one per node)."""
    if isinstance(client, redis.RedisCluster):
        return {id(node.redis_connection.connection_pool) for node in client.get_nodes()}
    return {id(client.connection_pool)}
