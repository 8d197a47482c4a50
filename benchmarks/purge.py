"""Measure the purge on PostgreSQL: records deleted per second, and claim latency while it runs.

    DATABASE_URL=postgres://postgres@127.0.0.1:54329/idempotency python benchmarks/purge.py

It works in a throw-away database of its own (created beside DATABASE_URL's, dropped at the
end): inserts the expired records in one INSERT … SELECT generate_series statement, measures
fresh claims (begin + complete, atomic mode) from --clients threads (or, with --processes,
processes) for a few seconds, then purges while they go on claiming, and prints the purge rate and
both claim latency distributions. It stops by itself and exits non-zero if the purge left an
expired record behind or deleted a live one.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parent.parent


class Stop(Protocol):
    def is_set(self) -> bool: ...
    def set(self) -> None: ...


@dataclass
class Claims:
    """The fresh claims made while a phase ran: (monotonic start, latency in ms) each."""

    latencies: list[tuple[float, float]] = field(default_factory=list)
    errors: int = 0

    def summary(self, start: float = 0.0, end: float = float("inf")) -> str:
        """Percentiles of the claims that started between `start` and `end`."""
        ordered = sorted(ms for at, ms in self.latencies if start <= at <= end)
        if not ordered:
            return "no claims"
        starts = [at for at, _ in self.latencies]
        rate = len(ordered) / max(min(end, max(starts)) - max(start, min(starts)), 1e-9)

        def pct(p: float) -> float:
            return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]

        return (
            f"{rate:>5,.0f} claims/s  p50 {pct(50):6.2f}  p95 {pct(95):6.2f}  "
            f"p99 {pct(99):6.2f}  max {ordered[-1]:7.2f} ms  errors {self.errors}"
        )


def claim_loop(stop: Stop, worker: int) -> Claims:
    """Claim fresh keys and store a response, as a request in atomic mode does, until `stop`."""
    from django.db import connections
    from django.utils import timezone

    from django_idempotency.core.outcomes import Outcome, Scope, StoredResponse
    from django_idempotency.stores import ClaimRequest, get_store

    store = get_store()
    response = StoredResponse(201, [("Content-Type", "application/json")], b'{"id": 1}')
    claims = Claims()
    number = 0
    try:
        while not stop.is_set():
            number += 1
            request = ClaimRequest(
                scope=Scope("live", "", f"{worker}-{number}-{time.monotonic_ns()}"),
                fingerprint="f" * 64,
                method="POST",
                path="/payments/",
                now=timezone.now(),
                ttl=timedelta(hours=24),
                lease=None,
            )
            at = time.monotonic()
            started = time.perf_counter()
            try:
                with store.atomic():
                    claim = store.begin(request)
                    ok = claim.outcome is Outcome.FRESH and store.complete(
                        claim, response, timezone.now()
                    )
            except Exception:
                ok = False
            if ok:
                claims.latencies.append((at, (time.perf_counter() - started) * 1000))
            else:
                claims.errors += 1
    finally:
        connections.close_all()  # Lets the benchmark database be dropped.
    return claims


def _claim_process(stop: Stop, worker: int, results: Any) -> None:
    results.put(claim_loop(stop, worker))


@contextmanager
def claiming(clients: int, processes: bool) -> Iterator[Claims]:
    """Claim from `clients` threads (or processes) while the block runs; fill the Claims."""
    from django.db import connections

    total = Claims()
    if processes:
        context = multiprocessing.get_context("fork")
        stop: Stop = context.Event()
        queue = context.Queue()
        connections.close_all()  # A forked child must open its own connection.
        workers: list[Any] = [
            context.Process(target=_claim_process, args=(stop, n, queue)) for n in range(clients)
        ]
    else:
        stop = threading.Event()
        results: list[Claims] = []
        workers = [
            threading.Thread(target=lambda n=n: results.append(claim_loop(stop, n)))
            for n in range(clients)
        ]
    for worker in workers:
        worker.start()
    try:
        yield total
    finally:
        stop.set()
        collected = [queue.get() for _ in workers] if processes else results
        for worker in workers:
            worker.join()
        for claims in collected:
            total.latencies += claims.latencies
            total.errors += claims.errors


def insert_expired(count: int, live: int) -> None:
    """`count` expired records (1 in 100 an abandoned claim) and `live` unexpired ones."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO django_idempotency_record
              (namespace, owner, key, fingerprint, status, method, path, response_status,
               response_headers, response_body, lease_token, lease_expires_at, created_at,
               completed_at, expires_at)
            SELECT 'bench', 'user-' || (i %% 1000), 'expired-' || i, repeat('0', 64),
                   CASE WHEN i %% 100 = 0 THEN 'in_progress' ELSE 'completed' END,
                   'POST', '/payments/', CASE WHEN i %% 100 = 0 THEN NULL ELSE 201 END,
                   '[["Content-Type", "application/json"]]'::jsonb,
                   CASE WHEN i %% 100 = 0 THEN NULL ELSE convert_to('{"id": ' || i || '}', 'UTF8')
                   END,
                   md5(i::text),
                   CASE WHEN i %% 100 = 0 THEN now() - interval '1 hour' END,
                   now() - interval '25 hours' + i * interval '1 ms',
                   CASE WHEN i %% 100 = 0 THEN NULL ELSE now() - interval '25 hours' END,
                   now() - interval '1 hour' + i * interval '1 ms'
            FROM generate_series(1, %s) AS i
            UNION ALL
            SELECT 'bench', '', 'live-' || i, repeat('0', 64), 'completed', 'POST', '/payments/',
                   201, '[]'::jsonb, convert_to('{}', 'UTF8'), md5(i::text), NULL, now(), now(),
                   now() + interval '24 hours'
            FROM generate_series(1, %s) AS i
            """,
            [count, live],
        )
        # What autovacuum would have done by the time a purge job runs.
        cursor.execute("ANALYZE django_idempotency_record")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="expired records")
    parser.add_argument("--live", type=int, default=100_000, help="unexpired records kept")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=4, help="threads claiming fresh keys")
    parser.add_argument(
        "--processes",
        action="store_true",
        help="claim from processes instead of threads (no GIL shared with the purge)",
    )
    parser.add_argument("--baseline", type=float, default=5.0, help="seconds of claims alone")
    options = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.db import connection

    from django_idempotency.models import IdempotencyRecord
    from django_idempotency.purge import purge_expired_records
    from django_idempotency.stores import PurgeResult

    if connection.vendor != "postgresql":
        sys.exit("Set DATABASE_URL to a PostgreSQL database: this benchmark measures PostgreSQL.")
    connection.settings_dict["TEST"]["NAME"] = f"idempotency_purge_bench_{os.getpid()}"
    original_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        print(
            f"PostgreSQL {connection.pg_version // 10000}, {os.cpu_count()} cores; "
            f"{options.records:,} expired + {options.live:,} live records, "
            f"batch size {options.batch_size:,}, {options.clients} claiming "
            f"{'processes' if options.processes else 'threads'}; "
            f"load average {os.getloadavg()[0]:.1f}"
        )
        started = time.perf_counter()
        insert_expired(options.records, options.live)
        print(f"Inserted in {time.perf_counter() - started:.1f} s")

        with claiming(options.clients, options.processes) as before:
            time.sleep(options.baseline)

        batch_times: list[float] = []
        last = time.perf_counter()

        def progress(result: PurgeResult) -> None:
            nonlocal last
            now = time.perf_counter()
            batch_times.append((now - last) * 1000)
            last = now

        with claiming(options.clients, options.processes) as during:
            time.sleep(0.5)  # Claims are under way before the purge starts.
            last = time.perf_counter()
            purge_started = time.monotonic()
            report = purge_expired_records(batch_size=options.batch_size, progress=progress)
            purge_ended = time.monotonic()

        left = IdempotencyRecord.objects.filter(namespace="bench").count()
        live = IdempotencyRecord.objects.filter(key__startswith="live-").count()
        print(
            f"Purged {report.total:,} records ({report.expired:,} expired, "
            f"{report.abandoned:,} abandoned) in {report.batches:,} batches, "
            f"{report.seconds:.2f} s: {report.total / report.seconds:,.0f} records/s"
        )
        tenth = max(1, len(batch_times) // 10)
        print(
            f"Batch duration: median {statistics.median(batch_times):.1f} ms "
            f"(first tenth {statistics.median(batch_times[:tenth]):.1f}, "
            f"last tenth {statistics.median(batch_times[-tenth:]):.1f}), "
            f"max {max(batch_times):.1f} ms"
        )
        print(f"Claims before the purge: {before.summary()}")
        print(f"Claims during the purge: {during.summary(purge_started, purge_ended)}")
        print(f"Left: {left - live:,} expired (expected 0), {live:,} live of {options.live:,}")
        if left - live or live != options.live:
            sys.exit("The purge left expired records behind or deleted live ones.")
    finally:
        connection.creation.destroy_test_db(original_name, verbosity=0)


if __name__ == "__main__":
    main()
