"""The store contract (django_idempotency.testing.contract), run against every shipped set-up."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.db import connection, connections, transaction
from django.db.models import F
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

    @contextlib.contextmanager
    def record_locked(self, store: BaseStore, scope: Scope) -> Iterator[bool]:
        """Another connection's transaction holds the record's row (SELECT … FOR UPDATE); on
        SQLite, which has no row locks, the whole database, by writing to the record."""
        locked, done = threading.Event(), threading.Event()

        def hold() -> None:
            try:
                with transaction.atomic():
                    record = IdempotencyRecord.objects.select_for_update().filter(
                        namespace=scope.namespace, owner=scope.owner, key=scope.key
                    )
                    record.update(fingerprint=F("fingerprint"))
                    locked.set()
                    done.wait(30)
            finally:
                connections.close_all()  # This thread's own.

        holder = threading.Thread(target=hold)
        holder.start()
        sqlite = connection.vendor == "sqlite"
        try:
            assert locked.wait(10)
            if sqlite:  # The renewal waits for the writer this long, not its default 5 s.
                with connection.cursor() as cursor:
                    cursor.execute("PRAGMA busy_timeout = 100")
            yield True
        finally:
            done.set()
            holder.join(30)
            if sqlite:
                with connection.cursor() as cursor:
                    cursor.execute("PRAGMA busy_timeout = 5000")


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

    def make_store(self) -> BaseStore:
        return RedisStore()  # On the Redis the `store` fixture set up.

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
