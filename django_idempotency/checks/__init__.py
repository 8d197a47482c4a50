"""System checks that report IDEMPOTENCY_* misconfiguration before the first request.

`settings` checks the values, `stores` the store and its database, `views` the routed views;
`ids` holds every check's id, `reading` how the checks read settings without raising.
"""

from django_idempotency.checks.ids import (
    ATOMIC_ON_LEASE_ONLY_STORE,
    DISABLED_IN_DEPLOYMENT,
    DURATION_OUT_OF_RANGE,
    INVALID_BYTE_COUNT,
    INVALID_CHOICE,
    INVALID_COLLECTION,
    INVALID_DURATION,
    INVALID_HEADER,
    INVALID_REPLICA_COUNT,
    INVALID_VIEW_ATTRIBUTE,
    MEMORY_STORE_IN_DEPLOYMENT,
    MIDDLEWARE_NOT_LAST,
    MIXIN_AFTER_API_VIEW,
    NAMESPACE_TOO_LONG,
    NOT_A_BOOLEAN,
    NOT_A_STORE,
    NOT_CALLABLE,
    SQLITE_IN_DEPLOYMENT,
    TABLE_MISSING,
    TAG,
    TTL_SHORTER_THAN_LEASE,
    UNKNOWN_CACHE,
    UNKNOWN_DATABASE,
    UNKNOWN_SETTING,
    UNRESOLVABLE_PATH,
    UNSHARED_CACHE,
    UNSUPPORTED_DATABASE,
    UNUSABLE_REDIS_CACHE,
)
from django_idempotency.checks.settings import check_settings
from django_idempotency.checks.stores import check_database, check_deployment
from django_idempotency.checks.views import check_views

__all__ = [
    "ATOMIC_ON_LEASE_ONLY_STORE",
    "DISABLED_IN_DEPLOYMENT",
    "DURATION_OUT_OF_RANGE",
    "INVALID_BYTE_COUNT",
    "INVALID_CHOICE",
    "INVALID_COLLECTION",
    "INVALID_DURATION",
    "INVALID_HEADER",
    "INVALID_REPLICA_COUNT",
    "INVALID_VIEW_ATTRIBUTE",
    "MEMORY_STORE_IN_DEPLOYMENT",
    "MIDDLEWARE_NOT_LAST",
    "MIXIN_AFTER_API_VIEW",
    "NAMESPACE_TOO_LONG",
    "NOT_A_BOOLEAN",
    "NOT_A_STORE",
    "NOT_CALLABLE",
    "SQLITE_IN_DEPLOYMENT",
    "TABLE_MISSING",
    "TAG",
    "TTL_SHORTER_THAN_LEASE",
    "UNKNOWN_CACHE",
    "UNKNOWN_DATABASE",
    "UNKNOWN_SETTING",
    "UNRESOLVABLE_PATH",
    "UNSHARED_CACHE",
    "UNSUPPORTED_DATABASE",
    "UNUSABLE_REDIS_CACHE",
    "check_database",
    "check_deployment",
    "check_settings",
    "check_views",
]
