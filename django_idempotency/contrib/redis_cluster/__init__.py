"""Redis Cluster for the Redis store and the cache tier: a django-redis client on RedisCluster.

Set `OPTIONS["CLIENT_CLASS"] = "django_idempotency.contrib.redis_cluster.RedisClusterClient"` on
the django-redis alias; see docs/stores.md (Redis Cluster).
"""

from __future__ import annotations

from django_idempotency.contrib import missing

try:
    from django_idempotency.contrib.redis_cluster.client import RedisClusterClient
except ModuleNotFoundError as exc:
    raise missing(exc, "redis") from exc

__all__ = ["RedisClusterClient"]
