"""The demo's settings with an existing package's guard in front of it (benchmarks/peers.py)."""

from __future__ import annotations

import os

from testproject.settings import *  # noqa: F403 (the demo, unchanged but for the peer below)
from testproject.settings import INSTALLED_APPS, MIDDLEWARE

PEER = os.environ["BENCH_PEER"]
REDIS_URL = os.environ["REDIS_URL"].rstrip("/")

# Each package as its README sets it up, guarding every POST that carries a key: the demo's
# plain create (/api/bench/plain/) is the endpoint they guard. Their records live apart from
# this package's (their own tables, Redis databases 5 and 6).
if PEER in ("drf-idempotency-redis", "drf-idempotency-database"):
    INSTALLED_APPS = [*INSTALLED_APPS, "drf_idempotency"]
    MIDDLEWARE = [*MIDDLEWARE, "drf_idempotency.middleware.IdempotencyMiddleware"]
    IDEMPOTENCY = (
        {
            "BACKEND": "drf_idempotency.backends.redis.RedisBackend",
            "BACKEND_OPTIONS": {"url": f"{REDIS_URL}/5"},
        }
        if PEER.endswith("redis")
        else {"BACKEND": "drf_idempotency.backends.database.DatabaseBackend"}
    )
elif PEER == "django-idempotency-key":
    MIDDLEWARE = [*MIDDLEWARE, "idempotency_key.middleware.IdempotencyKeyMiddleware"]
    IDEMPOTENCY_KEY = {
        # Responses in the demo's Redis cache alias; the lock across processes in Redis too
        # (its default lock is per process).
        "STORAGE": {
            "CLASS": "idempotency_key.storage.CacheKeyStorage",
            "CACHE_NAME": "idempotency",
        },
        "LOCK": {
            "CLASS": "idempotency_key.locks.redis.MultiProcessRedisLock",
            "LOCATION": f"{REDIS_URL}/6",
        },
    }
else:
    raise ValueError(f"BENCH_PEER={PEER!r}: not a package benchmarks/peers.py knows")
