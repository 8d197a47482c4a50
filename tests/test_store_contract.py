"""The store contract (django_idempotency.testing.contract), run against every shipped set-up."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.conf import settings
from django.test import override_settings

from django_idempotency.core.outcomes import Scope
from django_idempotency.models import IdempotencyRecord
from django_idempotency.stores import BaseStore, get_store
from django_idempotency.stores.cache import CacheTier
from django_idempotency.stores.database import DatabaseStore
from django_idempotency.stores.memory import MemoryStore
from django_idempotency.stores.redis import RedisStore
from django_idempotency.testing.contract import StoreContract
from tests.stores import REDIS_URL, using_store
from tests.utils import clear_own_keys, redis_caches

LOCMEM = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "contract"}


@pytest.mark.django_db(transaction=True)
class TestDatabaseStore(StoreContract):
    """On the database the run is configured for: SQLite, PostgreSQL or MariaDB."""

    def make_store(self) -> BaseStore:
        return DatabaseStore()

    def forget_record(self, store: BaseStore, scope: Scope) -> None:
        IdempotencyRecord.objects.filter(
            namespace=scope.namespace, owner=scope.owner, key=scope.key
        ).delete()
        store.forget([scope])


class TestCacheTierOnLocMem(TestDatabaseStore):
    """The cache tier in front of the database store, its copies in Django's LocMemCache."""

    @pytest.fixture
    def store(self) -> Iterator[BaseStore]:
        with override_settings(CACHES={**settings.CACHES, "tier": LOCMEM}):
            yield CacheTier(DatabaseStore(), "tier")


@pytest.mark.redis
class TestCacheTierOnRedis(TestDatabaseStore):
    """The cache tier in front of the database store, its copies in Redis via django-redis."""

    @pytest.fixture
    def store(self) -> Iterator[BaseStore]:
        with override_settings(CACHES=redis_caches(f"{REDIS_URL}/2")):
            clear_own_keys()  # Fails loudly when Redis is not running.
            yield CacheTier(DatabaseStore(), "idempotency")
            clear_own_keys()


@pytest.mark.redis
class TestRedisStore(StoreContract):
    @pytest.fixture
    def store(self) -> Iterator[BaseStore]:
        with using_store("redis"):
            yield get_store()

    def forget_record(self, store: BaseStore, scope: Scope) -> None:
        assert isinstance(store, RedisStore)
        store.connection().delete(store.record_key(scope))
        store.forget([scope])


class TestMemoryStore(StoreContract):
    def make_store(self) -> BaseStore:
        return MemoryStore()

    def forget_record(self, store: BaseStore, scope: Scope) -> None:
        assert isinstance(store, MemoryStore)
        del store.records[scope]
        store.forget([scope])
