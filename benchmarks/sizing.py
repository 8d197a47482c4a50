"""Measure what a record costs to keep: bytes on disk, WAL per request, Redis memory per record.

    DATABASE_URL=postgres://postgres@127.0.0.1:54329/idempotency \
    REDIS_URL=redis://127.0.0.1:63799 python benchmarks/sizing.py

It works in a throw-away PostgreSQL database of its own (created beside DATABASE_URL's, dropped
at the end) and in one Redis database (REDIS_URL's number, default 15, emptied before and after):

- WAL per request: pg_current_wal_lsn() before and after --requests fresh requests through the
  store API (begin + complete; atomic mode, then lease mode) and as many replays (the lookup a
  replay makes), the first batch right after a CHECKPOINT (every page touched for the first time
  since then is written whole to the WAL when full_page_writes is on), the second right after it;
- bytes per record on disk: --records representative records (a 201 JSON response of about
  300 bytes, random UUID keys) inserted in one INSERT … SELECT generate_series, then the table's,
  its TOAST's and each index's size, and the average row (pg_column_size);
- Redis memory per record: MEMORY USAGE of the Redis store's completed records and of the cache
  tier's copies of the same response, and used_memory's growth per record over --redis-records.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# A representative stored response: a DRF 201 with a JSON body of about 300 bytes.
BODY = json.dumps(
    {
        "id": "pay_7Yp3kTq9rXb2LmN4vC8sW1dZ",
        "object": "payment",
        "amount": 2500,
        "currency": "EUR",
        "status": "succeeded",
        "description": "Order 100042",
        "customer": "cus_Q2wE4rT6yU8iO0pA",
        "created": "2026-11-26T02:30:00.000000Z",
        "metadata": {"order_id": "100042", "channel": "web"},
        "receipt_url": "https://example.com/receipts/pay_7Yp3kTq9rXb2LmN4vC8sW1dZ",
    },
    separators=(",", ":"),
).encode()
HEADERS = [
    ("Content-Type", "application/json"),
    ("Vary", "Accept, Cookie"),
    ("Allow", "GET, POST, HEAD, OPTIONS"),
    ("X-Frame-Options", "DENY"),
]


def mib(size: float) -> str:
    return f"{size / 1024 / 1024:,.1f} MiB"


def wal_lsn(cursor: Any) -> int:
    cursor.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
    return int(cursor.fetchone()[0])


def claim_request(namespace: str, lease: timedelta | None) -> Any:
    from django.utils import timezone

    from django_idempotency.core.outcomes import Scope
    from django_idempotency.stores import ClaimRequest

    return ClaimRequest(
        scope=Scope(namespace, "user:4242", str(uuid.uuid4())),
        fingerprint=uuid.uuid4().hex * 2,
        method="POST",
        path="/api/payments/",
        now=timezone.now(),
        ttl=timedelta(hours=24),
        lease=lease,
    )


def fresh(store: Any, request: Any) -> Any:
    """One fresh request through the store: claim, then store the response."""
    from django.utils import timezone

    from django_idempotency.core.outcomes import Outcome, StoredResponse

    response = StoredResponse(201, list(HEADERS), BODY)
    if request.lease is None:
        with store.atomic():
            claim = store.begin(request)
            assert claim.outcome is Outcome.FRESH, claim
            assert store.complete(claim, response, timezone.now())
    else:
        claim = store.begin(request)
        assert claim.outcome is Outcome.FRESH, claim
        assert store.complete(claim, response, timezone.now())
    return claim


def measure_wal(requests: int) -> None:
    from django.db import connection
    from django.utils import timezone

    from django_idempotency.stores.database import DatabaseStore

    store = DatabaseStore()
    print(f"\nWAL per request, {requests:,} requests per batch through the store API:")
    with connection.cursor() as cursor:
        for mode, lease in (("atomic", None), ("lease", timedelta(seconds=30))):
            replays = []
            for batch in ("after a CHECKPOINT", "the next batch"):
                if batch.startswith("after"):
                    cursor.execute("CHECKPOINT")
                before = wal_lsn(cursor)
                for _ in range(requests):
                    request = claim_request(f"wal-{mode}", lease)
                    fresh(store, request)
                    replays.append(request)
                written = wal_lsn(cursor) - before
                print(f"  fresh, {mode:6}, {batch:18}: {written / requests:8,.0f} bytes/request")
            for batch in ("after a CHECKPOINT", "the next batch"):
                if batch.startswith("after"):
                    cursor.execute("CHECKPOINT")
                before = wal_lsn(cursor)
                for request in replays[:requests]:
                    claim = store.lookup(replace(request, now=timezone.now()))
                    assert claim is not None and claim.response is not None, claim
                written = wal_lsn(cursor) - before
                print(f"  replay, {mode:5}, {batch:18}: {written / requests:8,.0f} bytes/request")
        # The records just written through the store: each was inserted by its claim and
        # updated by its completion, so the table holds a dead version of each until vacuum.
        cursor.execute("SELECT count(*) FROM django_idempotency_record")
        count = cursor.fetchone()[0]
        for when in ("before VACUUM", "after VACUUM"):
            if when.startswith("after"):
                cursor.execute("VACUUM django_idempotency_record")
            cursor.execute("SELECT pg_total_relation_size('django_idempotency_record')")
            total = cursor.fetchone()[0]
            print(
                f"  the {count:,} records written through the store, {when}: "
                f"{total / count:,.0f} bytes/record (table, TOAST and indexes)"
            )


def measure_disk(records: int) -> None:
    from django.db import connection

    print(f"\nOn disk, {records:,} representative records (generate_series):")
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE django_idempotency_record")
        before = wal_lsn(cursor)
        started = time.perf_counter()
        cursor.execute(
            """
            INSERT INTO django_idempotency_record
              (namespace, owner, key, fingerprint, status, method, path, response_status,
               response_headers, response_body, lease_token, lease_expires_at, created_at,
               completed_at, expires_at)
            SELECT 'payments.views.PaymentViewSet', 'user:' || (i %% 5000), gen_random_uuid()::text,
                   md5(i::text) || md5((-i)::text), 'completed', 'POST', '/api/payments/', 201,
                   %s::jsonb, %s, md5(i::text), NULL,
                   now() + i * interval '1 ms', now() + i * interval '1 ms',
                   now() + interval '24 hours' + i * interval '1 ms'
            FROM generate_series(1, %s) AS i
            """,
            [json.dumps([list(pair) for pair in HEADERS]), BODY, records],
        )
        inserted_wal = wal_lsn(cursor) - before
        print(
            f"  inserted in {time.perf_counter() - started:.1f} s, "
            f"WAL {inserted_wal / records:,.0f} bytes/record (one statement)"
        )
        cursor.execute("VACUUM ANALYZE django_idempotency_record")
        cursor.execute(
            "SELECT avg(pg_column_size(r.*)), avg(pg_column_size(response_body)), "
            "avg(pg_column_size(response_headers)) FROM django_idempotency_record r"
        )
        row, body, headers = (float(value) for value in cursor.fetchone())
        print(
            f"  average row {row:,.0f} bytes (body {body:,.0f}, headers {headers:,.0f}; "
            f"the body as sent: {len(BODY)} bytes)"
        )
        cursor.execute(
            """
            SELECT pg_relation_size(c.oid), pg_total_relation_size(c.oid),
                   coalesce(pg_total_relation_size(c.reltoastrelid), 0),
                   pg_indexes_size(c.oid)
            FROM pg_class c WHERE c.relname = 'django_idempotency_record'
            """
        )
        heap, total, toast, indexes = cursor.fetchone()
        per_million = 1_000_000 / records
        print(
            f"  table {mib(heap)} ({heap / records:,.0f} bytes/record), TOAST {mib(toast)}, "
            f"indexes {mib(indexes)}, total {mib(total)} ({total / records:,.0f} bytes/record)"
        )
        print(
            f"  per million records (x{per_million:g}, extrapolated): table "
            f"{mib(heap * per_million)}, indexes {mib(indexes * per_million)}, "
            f"total {mib(total * per_million)}"
        )
        cursor.execute(
            """
            SELECT i.relname, pg_relation_size(i.oid)
            FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
            WHERE x.indrelid = 'django_idempotency_record'::regclass ORDER BY 2 DESC
            """
        )
        for name, size in cursor.fetchall():
            print(
                f"    {name:40} {mib(size):>10} ({size / records:,.0f} bytes/record; "
                f"{mib(size * per_million)} per million, extrapolated)"
            )

        # The same records expired, then purged (batches of 1,000) after a CHECKPOINT: a day-old
        # record's page has not been written since the last checkpoint, so its first change is
        # logged with the whole page, as in an hourly purge.
        cursor.execute("UPDATE django_idempotency_record SET expires_at = now() - interval '1 h'")
        cursor.execute("VACUUM django_idempotency_record")
        cursor.execute("CHECKPOINT")
        before = wal_lsn(cursor)
    from django_idempotency.purge import purge_expired_records

    report = purge_expired_records(batch_size=1000)
    with connection.cursor() as cursor:
        written = wal_lsn(cursor) - before
    print(
        f"  purged {report.total:,} records in {report.seconds:.1f} s "
        f"({report.total / report.seconds:,.0f} records/s), WAL {written / report.total:,.0f} "
        f"bytes/record"
    )


def measure_redis(count: int) -> None:
    from django.test import override_settings

    url = os.environ["REDIS_URL"].rstrip("/")
    location = url if url.rsplit("/", 1)[-1].isdigit() else f"{url}/15"
    options = {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 1}
    caches = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "sizing": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": location,
            "OPTIONS": options,
        },
    }
    with override_settings(
        CACHES=caches, IDEMPOTENCY_REDIS_CACHE="sizing", IDEMPOTENCY_MODE="lease"
    ):
        from django_redis import get_redis_connection

        from django_idempotency.core.outcomes import StoredResponse
        from django_idempotency.stores.cache import CacheTier, cache_key
        from django_idempotency.stores.database import DatabaseStore
        from django_idempotency.stores.redis import RedisStore

        redis = get_redis_connection("sizing")
        redis.flushdb()
        store = RedisStore()
        tier = CacheTier(DatabaseStore(), "sizing")
        print(f"\nRedis {redis.info('server')['redis_version']}, {location}, {count:,} records:")
        try:
            for name in ("the Redis store's record", "the cache tier's copy"):
                redis.flushdb()
                used = redis.info("memory")["used_memory"]
                sizes, keys = [], []
                for _ in range(count):
                    request = claim_request("payments.views.PaymentViewSet", timedelta(seconds=30))
                    if name.startswith("the Redis"):
                        claim = fresh(store, request)
                        key = store.record_key(claim.scope)
                    else:
                        claim = fresh(tier.inner, request)
                        response = StoredResponse(201, list(HEADERS), BODY)
                        tier._keep(claim, response, time.monotonic())
                        key = tier.cache.make_key(cache_key(claim.scope))
                    keys.append(key)
                grown = redis.info("memory")["used_memory"] - used
                for key in keys:
                    sizes.append(redis.memory_usage(key, samples=0))
                encoding = redis.object("encoding", keys[0])
                print(
                    f"  {name}: MEMORY USAGE median {statistics.median(sizes):,.0f} bytes "
                    f"(min {min(sizes):,}, max {max(sizes):,}; encoding {encoding.decode()}); "
                    f"used_memory grew {grown / count:,.0f} bytes/record"
                )
        finally:
            redis.flushdb()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="per WAL batch")
    parser.add_argument("--records", type=int, default=100_000, help="rows for the disk sizes")
    parser.add_argument("--redis-records", type=int, default=1000)
    options = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.db import connection

    if connection.vendor != "postgresql":
        sys.exit("Set DATABASE_URL to a PostgreSQL database: this script measures PostgreSQL.")
    connection.settings_dict["TEST"]["NAME"] = f"idempotency_sizing_{os.getpid()}"
    original_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SHOW full_page_writes")
            full_page_writes = cursor.fetchone()[0]
            cursor.execute("SHOW fsync")
            fsync = cursor.fetchone()[0]
        print(
            f"PostgreSQL {connection.pg_version // 10000}, full_page_writes={full_page_writes}, "
            f"fsync={fsync}; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
            f"body {len(BODY)} bytes"
        )
        measure_wal(options.requests)
        if os.environ.get("REDIS_URL"):
            measure_redis(options.redis_records)
        else:
            print("\nREDIS_URL not set: Redis memory not measured.")
        measure_disk(options.records)
    finally:
        connection.close()
        connection.creation.destroy_test_db(original_name, verbosity=0)


if __name__ == "__main__":
    main()
