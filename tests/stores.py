"""Every store under test, and what each one holds, read the same way whichever it is."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from django_idempotency.attempts import current_attempt
from django_idempotency.core.outcomes import Claim, Outcome, Scope
from django_idempotency.models import IdempotencyRecord
from django_idempotency.stores import BaseStore, ClaimRequest, _store_for, get_store
from django_idempotency.stores.cache import CacheTier
from django_idempotency.stores.memory import MemoryStore
from django_idempotency.stores.redis import RedisStore
from django_idempotency.stores.redis import _ms as redis_ms
from tests.utils import fingerprint_of, redis_caches

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:63799")

STORES = {
    "database": "django_idempotency.stores.database.DatabaseStore",
    "redis": "django_idempotency.stores.redis.RedisStore",
    "memory": "django_idempotency.stores.memory.MemoryStore",
}

# pytest params: the Redis one carries the `redis` marker (it needs the server).
STORE_PARAMS = [
    pytest.param("database"),
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("memory"),
]


# The stores several processes share (the memory store is one process's): the database store on
# a server, and Redis.
SHARED_STORES = [
    pytest.param("database", marks=[pytest.mark.postgresql, pytest.mark.mariadb]),
    pytest.param("redis", marks=pytest.mark.redis),
]


# The database store in both its modes; the other stores in lease mode, their only one.
STORE_MODES = [
    pytest.param(("database", "atomic"), id="database-atomic"),
    pytest.param(("database", "lease"), id="database-lease"),
    pytest.param(("redis", "lease"), id="redis-lease", marks=pytest.mark.redis),
    pytest.param(("memory", "lease"), id="memory-lease"),
]


def redis_settings(url: str = f"{REDIS_URL}/3") -> dict[str, Any]:
    """The Redis store on `url`; keys prefixed per process, so that parallel test processes
    never see (or delete) each other's records."""
    caches = redis_caches(url)
    return {
        "CACHES": caches,
        "IDEMPOTENCY_STORE": STORES["redis"],
        "IDEMPOTENCY_REDIS_CACHE": "idempotency",
        "IDEMPOTENCY_MODE": "lease",
    }


@contextlib.contextmanager
def using_store(name: str) -> Iterator[str]:
    """Every request and call inside goes through the store `name`, which starts empty."""
    if name == "database":
        yield name
        return
    if name == "redis":
        overrides = redis_settings()
    else:
        overrides = {"IDEMPOTENCY_STORE": STORES[name], "IDEMPOTENCY_MODE": "lease"}
    with override_settings(**overrides):
        _store_for.cache_clear()  # A new instance: a memory store starts empty.
        _clear_redis()
        try:
            yield name
        finally:
            _clear_redis()
            _store_for.cache_clear()


def _clear_redis() -> None:
    store = _unwrapped(get_store())
    if isinstance(store, RedisStore):
        keys = redis_keys(store)
        if keys:
            store.connection().delete(*keys)


@dataclass(frozen=True)
class Stored:
    """A record as any store holds it."""

    namespace: str
    owner: str
    key: str
    status: str
    method: str
    path: str
    response_status: int | None
    response_body: bytes | None
    created_at: datetime
    expires_at: datetime


def stored() -> list[Stored]:
    """Every record the configured store holds, in no particular order."""
    store = _unwrapped(get_store())
    if isinstance(store, MemoryStore):
        return [
            Stored(
                *(scope.namespace, scope.owner, scope.key, record.status),
                *(record.method, record.path),
                record.response.status if record.response else None,
                record.response.body if record.response else None,
                record.created_at,
                record.expires_at,
            )
            for scope, record in store.records.items()
        ]
    if isinstance(store, RedisStore):
        return _stored_in_redis(store)
    return [
        Stored(
            *(r.namespace, r.owner, r.key, r.status, r.method, r.path, r.response_status),
            None if r.response_body is None else bytes(r.response_body),
            r.created_at,
            r.expires_at,
        )
        for r in IdempotencyRecord.objects.all()
    ]


def the_record() -> Stored:
    """The one record the store holds."""
    records = stored()
    assert len(records) == 1, records
    return records[0]


def expire_all(moment: datetime) -> None:
    """Make every record expire at `moment`, as if its TTL had run out."""
    store = _unwrapped(get_store())
    if isinstance(store, MemoryStore):
        for scope, record in list(store.records.items()):
            store.records[scope] = replace(record, expires_at=moment)
    elif isinstance(store, RedisStore):
        connection = store.connection()
        for key in redis_keys(store):
            connection.hset(key, "expires_at", redis_ms(moment))
    else:
        IdempotencyRecord.objects.update(expires_at=moment)


def _stored_in_redis(store: RedisStore) -> list[Stored]:
    connection = store.connection()
    like = timezone.now()
    records = []
    for key in redis_keys(store):
        fields = {name.decode(): value for name, value in connection.hgetall(key).items()}
        text = {name: value.decode() for name, value in fields.items() if name != "response_body"}
        records.append(
            Stored(
                *(text["namespace"], text["owner"], text["key"], text["status"]),
                *(text["method"], text["path"]),
                int(text["response_status"]) if "response_status" in text else None,
                fields.get("response_body"),
                datetime.fromtimestamp(int(text["created_at"]) / 1000, tz=like.tzinfo),
                datetime.fromtimestamp(int(text["expires_at"]) / 1000, tz=like.tzinfo),
            )
        )
    return records


def redis_keys(store: RedisStore) -> list[bytes]:
    pattern = store.record_key(Scope("", "", "")).split("{")[0] + "*"
    return list(store.connection().scan_iter(match=pattern, count=1000))


def _unwrapped(store: BaseStore) -> BaseStore:
    return store.inner if isinstance(store, CacheTier) else store


KEY_1 = Scope("default", "", "key-1")


def claim_request(
    scope: Scope = KEY_1,
    *,
    fingerprint: str = "f" * 64,
    path: str = "/function/charges/",
    ttl: float = 3600,
    lease: float = 60,
) -> ClaimRequest:
    """What the guard asks a store for a POST to `path` now, in lease mode."""
    return ClaimRequest(
        scope=scope,
        fingerprint=fingerprint,
        method="POST",
        path=path,
        now=timezone.now(),
        ttl=timedelta(seconds=ttl),
        lease=timedelta(seconds=lease),
    )


def hold(scope: Scope, url: str, body: dict[str, Any]) -> Claim:
    """A POST of `body` to `url` with the scope's key, still running: its claim, leased."""
    return get_store().begin(claim_request(scope, fingerprint=fingerprint_of(url, body), path=url))


def take_over_running() -> Claim:
    """Another caller takes the running operation's key over, as if its lease had run out (the
    process stalled two minutes, its heartbeat too): the new owner's claim."""
    attempt = current_attempt()
    assert attempt is not None and attempt.claim is not None and attempt.scope is not None
    held = attempt.claim
    assert held.fingerprint is not None
    request = ClaimRequest(
        scope=attempt.scope,
        fingerprint=held.fingerprint,
        method=held.method,
        path=held.path,
        now=get_store().now() + timedelta(minutes=2),
        ttl=timedelta(hours=1),
        lease=timedelta(seconds=60),
    )
    claim = get_store().begin(request)
    assert claim.outcome is Outcome.FRESH
    return claim
