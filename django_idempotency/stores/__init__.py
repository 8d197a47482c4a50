"""Record stores: where claims and stored responses live, chosen by IDEMPOTENCY_STORE."""

from __future__ import annotations

from functools import lru_cache

from django_idempotency.conf import conf, load_callable, require_installed
from django_idempotency.stores.base import (
    BaseStore,
    ClaimRequest,
    PurgeOptions,
    PurgeResult,
    RecordLocked,
    ResponseTooLarge,
    StoreBusy,
    StoreUnavailable,
    UnstorableResponse,
)

__all__ = [
    "BaseStore",
    "ClaimRequest",
    "PurgeOptions",
    "PurgeResult",
    "RecordLocked",
    "ResponseTooLarge",
    "StoreBusy",
    "StoreUnavailable",
    "UnstorableResponse",
    "get_store",
]


def get_store() -> BaseStore:
    """The configured store, behind the cache tier when IDEMPOTENCY_CACHE names a cache.

    One instance per configuration, so requests pay no import or construction cost.
    """
    return _store_for(conf.STORE, conf.CACHE)


@lru_cache(maxsize=8)
def _store_for(dotted_path: str, cache_alias: str | None) -> BaseStore:
    try:
        store_class = load_callable(dotted_path, "IDEMPOTENCY_STORE")
    except RuntimeError:
        # A store keeping its records in this app's model (the database store) cannot even be
        # imported without the app in INSTALLED_APPS: say that, with the fix, rather than
        # Django's "isn't in an application in INSTALLED_APPS". The memory and Redis stores need
        # no model, and so serve functions and tasks without the app.
        require_installed()
        raise
    store = store_class()
    if not isinstance(store, BaseStore):
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(f"IDEMPOTENCY_STORE = {dotted_path!r} is not a BaseStore.")
    if cache_alias is not None:
        from django_idempotency.stores.cache import CacheTier

        return CacheTier(store, cache_alias)
    return store
