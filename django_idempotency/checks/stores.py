"""Checks of the store: its class, its cache and database, deployment, the records table."""

from __future__ import annotations

import sys
from collections.abc import Collection, Iterable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core import checks
from django.core.cache.backends.dummy import DummyCache
from django.core.cache.backends.locmem import LocMemCache
from django.core.checks import CheckMessage, Error
from django.db.utils import load_backend
from django.utils.module_loading import import_string

from django_idempotency.checks.ids import (
    ATOMIC_ON_LEASE_ONLY_STORE,
    DISABLED_IN_DEPLOYMENT,
    MEMORY_STORE_IN_DEPLOYMENT,
    MIGRATION_UNAPPLIED,
    NOT_A_STORE,
    SQLITE_IN_DEPLOYMENT,
    TABLE_MISSING,
    UNKNOWN_CACHE,
    UNKNOWN_DATABASE,
    UNSHARED_CACHE,
    UNSUPPORTED_DATABASE,
    UNUSABLE_REDIS_CACHE,
)
from django_idempotency.checks.reading import _load, _setting
from django_idempotency.conf import (
    DEFAULT_PATHS,
    conf,
    load_callable,
)
from django_idempotency.schema import (
    migrate_hint,
    missing_table,
    missing_table_message,
    records_database,
    unapplied_migrations,
)
from django_idempotency.stores.base import BaseStore
from django_idempotency.stores.database import DatabaseStore, records_alias
from django_idempotency.stores.memory import MemoryStore
from django_idempotency.stores.redis import RedisStore

if TYPE_CHECKING:
    from django.apps import AppConfig


_DEFAULT_STORE = DEFAULT_PATHS["STORE"]


def check_deployment(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """What is fine on a laptop but wrong under a production server (`check --deploy`)."""
    messages: list[CheckMessage] = []
    if _setting("IDEMPOTENCY_ENABLED") is False:
        messages.append(
            checks.Warning(
                f"IDEMPOTENCY_ENABLED = {_setting('IDEMPOTENCY_ENABLED')!r}: idempotency is"
                " switched off, so retried requests run their view again and no key is checked"
                " or required.",
                hint="Remove IDEMPOTENCY_ENABLED (or set it to True) once the emergency is over;"
                " it is meant for test suites and incidents, not for production.",
                id=DISABLED_IN_DEPLOYMENT,
            )
        )
    store_class = _store_class()
    if isinstance(store_class, type) and issubclass(store_class, MemoryStore):
        messages.append(
            Error(
                f"IDEMPOTENCY_STORE = {conf.STORE!r} keeps records in each process's memory.",
                hint="Other worker processes never see its claims, so a retry that reaches"
                " another process runs the view again, and a restart forgets every record. Use"
                " the database store (the default) or"
                " django_idempotency.stores.redis.RedisStore in production.",
                id=MEMORY_STORE_IN_DEPLOYMENT,
            )
        )
    database = _store_database()
    if database is not None and database[1] == "sqlite":
        alias = database[0]
        messages.append(
            checks.Warning(
                f"The idempotency store's database {alias!r} is SQLite"
                f" ({_database_source(alias)}).",
                hint="SQLite lets one connection write at a time: under a server with several"
                " worker processes, claims queue for its write lock, and a claim that cannot get"
                " it within the database timeout is answered 409 Conflict as if its key were in"
                " use. Use PostgreSQL in production (point IDEMPOTENCY_DATABASE at it), or"
                " add this id to SILENCED_SYSTEM_CHECKS if a single process serves the site.",
                id=SQLITE_IN_DEPLOYMENT,
            )
        )
    return messages


def _store_class() -> Any:
    """The IDEMPOTENCY_STORE class as `get_store` loads it, or the Error saying why it cannot."""
    return _load(
        "IDEMPOTENCY_STORE",
        partial(load_callable, conf.STORE, "IDEMPOTENCY_STORE"),
        "Set IDEMPOTENCY_STORE to the dotted path (a string, not the class) of a BaseStore"
        f" subclass, e.g. {_DEFAULT_STORE!r}.",
    )


def _store() -> Iterable[CheckMessage]:
    store_class = _store_class()
    if isinstance(store_class, CheckMessage):
        yield store_class
    elif not (isinstance(store_class, type) and issubclass(store_class, BaseStore)):
        yield Error(
            f"IDEMPOTENCY_STORE = {conf.STORE!r} is not a BaseStore subclass.",
            hint="Point IDEMPOTENCY_STORE at a subclass of django_idempotency.stores.BaseStore"
            f" that implements its contract, or remove it to use {_DEFAULT_STORE!r}.",
            id=NOT_A_STORE,
        )


def _cache() -> Iterable[CheckMessage]:
    alias = conf.CACHE
    if alias is None:
        return
    caches = settings.CACHES
    if alias not in caches:
        yield Error(
            f"IDEMPOTENCY_CACHE = {alias!r} is not an alias in CACHES"
            f" ({', '.join(map(repr, caches)) or 'none defined'}).",
            hint=f"Define the alias {alias!r} in CACHES (a shared cache such as Redis), or set"
            " IDEMPOTENCY_CACHE to an existing alias, or to None to turn the cache tier off.",
            id=UNKNOWN_CACHE,
        )
        return
    try:
        backend_path = str(caches[alias]["BACKEND"])
        backend = import_string(backend_path)
    except Exception:  # Django reports a broken cache when it is used; the tier uses the store.
        return
    if isinstance(backend, type) and issubclass(backend, DummyCache):
        why = "DummyCache stores nothing, so the tier never serves a replay and only adds a call"
    elif isinstance(backend, type) and issubclass(backend, LocMemCache):
        why = (
            "LocMemCache lives in one process's memory: a replay cached there is not seen by the"
            " other processes, and it keeps replaying a record after another process deletes it"
            " (from the admin, for example)"
        )
    else:
        return
    yield checks.Warning(
        f"IDEMPOTENCY_CACHE = {alias!r} uses {backend_path}, which cannot share replays"
        " between processes.",
        hint=f"{why}. Point IDEMPOTENCY_CACHE at a cache every process shares (Redis,"
        " Memcached), or set it to None.",
        id=UNSHARED_CACHE,
    )


def _database() -> Iterable[CheckMessage]:
    alias = conf.DATABASE
    if alias and alias not in settings.DATABASES:  # "" means unset, as it does for the store.
        yield Error(
            f"IDEMPOTENCY_DATABASE = {alias!r} is not an alias in DATABASES"
            f" ({', '.join(map(repr, settings.DATABASES))}).",
            hint="Set IDEMPOTENCY_DATABASE to an alias defined in DATABASES, or to None to use"
            " the database the routers choose for IdempotencyRecord.",
            id=UNKNOWN_DATABASE,
        )
        return
    database = _store_database()
    if database is not None and database[1] not in ("postgresql", "mysql", "sqlite"):
        store_alias, vendor, engine = database
        yield Error(
            f"The idempotency store's database {store_alias!r} ({_database_source(store_alias)})"
            " uses"
            f" {engine} ({vendor}); the database store supports PostgreSQL, MariaDB and SQLite.",
            hint="Point IDEMPOTENCY_DATABASE at a PostgreSQL or MariaDB database in DATABASES,"
            " or set IDEMPOTENCY_STORE to a store written for this database.",
            id=UNSUPPORTED_DATABASE,
        )


def _store_database() -> tuple[str, str, str] | None:
    """(alias, vendor, ENGINE) of the database store's database; None if another store is used.

    The vendor comes from the backend class, so no connection is opened; anything that cannot be
    determined is left to the checks (and errors) that own it.
    """
    store_class = _store_class()
    if not (isinstance(store_class, type) and issubclass(store_class, DatabaseStore)):
        return None
    try:
        alias = records_alias()
        engine = settings.DATABASES[alias].get("ENGINE") or "django.db.backends.dummy"
    except Exception:  # An unknown alias, a router that fails.
        return None
    try:
        vendor = load_backend(engine).DatabaseWrapper.vendor
    except Exception:  # Its driver is not installed here (cx_Oracle, mssql): name it by its path.
        vendor = engine.rsplit(".", 1)[-1]
    return alias, vendor, engine


def _database_source(alias: str) -> str:
    if conf.DATABASE:
        return f"IDEMPOTENCY_DATABASE = {alias!r}"
    return "IDEMPOTENCY_DATABASE is unset, so it is the database the routers choose"


def check_database(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Collection[str] | None = None,
    **kwargs: Any,
) -> list[CheckMessage]:
    """`check --database <alias>`: the records table exists where the store looks for it, and
    every migration of this app is applied to it."""
    alias = records_database()
    if not databases or alias is None or alias not in databases or _migrating():
        return []
    if missing_table(alias):
        return [
            checks.Warning(
                missing_table_message(alias),
                hint="Until it exists every guarded request is refused with 500"
                " store-misconfigured.",
                id=TABLE_MISSING,
            )
        ]
    unapplied = unapplied_migrations(alias)
    if not unapplied:
        return []
    return [
        checks.Warning(
            f"The database {alias!r} lacks migrations of django_idempotency:"
            f" {', '.join(unapplied)}.",
            hint=f"R{migrate_hint(alias)[1:]}: the store's statements expect the schema"
            " of the last migration.",
            id=MIGRATION_UNAPPLIED,
        )
    ]


def _migrating() -> bool:
    """Whether `migrate` runs these checks, as it does before it applies the migrations: it is
    about to create the table or apply what lacks, and saying "run migrate" then is noise."""
    frame = sys._getframe(1)
    while frame is not None:
        # Its `handle`, or (Django 5.2.x and later) `BaseCommand.execute` run by its command.
        command = frame.f_locals.get("self")
        if frame.f_globals.get("__name__") == _MIGRATE or type(command).__module__ == _MIGRATE:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


_MIGRATE = "django.core.management.commands.migrate"


def _lease_only_store() -> str | None:
    """The configured store's dotted path if it cannot run atomic mode, else None."""
    store_class = _store_class()
    if not (isinstance(store_class, type) and issubclass(store_class, BaseStore)):
        return None  # E007 or E009 says why.
    # A property (a wrapper deciding per instance) cannot be read from the class: not reported.
    supports_atomic = store_class.supports_atomic
    return conf.STORE if supports_atomic is False else None


def _atomic_on_lease_only_store(what: str, store: str) -> Error:
    return Error(
        f"{what} asks for atomic mode, but IDEMPOTENCY_STORE = {store!r} has lease mode only:"
        " its claims are not part of the view's database transaction, so the view's writes"
        " would not roll back with them.",
        hint='Use mode "lease" (IDEMPOTENCY_MODE = "lease", or remove the setting: such a store'
        " runs every view leased), or use the database store for views that need atomic mode.",
        id=ATOMIC_ON_LEASE_ONLY_STORE,
    )


def _atomic_setting_on_lease_only_store() -> Iterable[CheckMessage]:
    store = _lease_only_store()
    if store is not None and _setting("IDEMPOTENCY_MODE") == "atomic":
        yield _atomic_on_lease_only_store('IDEMPOTENCY_MODE = "atomic"', store)


def _redis_cache() -> Iterable[CheckMessage]:
    store_class = _store_class()
    if not (isinstance(store_class, type) and issubclass(store_class, RedisStore)):
        return
    alias = conf.REDIS_CACHE
    backend = settings.CACHES.get(alias, {}).get("BACKEND", "")
    try:
        usable = issubclass(import_string(backend), import_string(_DJANGO_REDIS))
    except ImportError:  # An alias that is missing, or django-redis not installed.
        usable = False
    if not usable:
        where = f"uses {backend}" if backend else "is not an alias in CACHES"
        yield Error(
            f"IDEMPOTENCY_REDIS_CACHE = {alias!r} {where}: the Redis store needs a django-redis"
            " cache for its connection.",
            hint=f"Define CACHES[{alias!r}] with BACKEND {_DJANGO_REDIS!r} (pip install"
            " django-idempotency[redis]), or point IDEMPOTENCY_REDIS_CACHE at such an alias.",
            id=UNUSABLE_REDIS_CACHE,
        )


_DJANGO_REDIS = "django_redis.cache.RedisCache"
