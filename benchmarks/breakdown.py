"""Where the time goes: one request at a time, in-process, through Django's WSGI handler."""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BODY = json.dumps({"amount": 100, "currency": "EUR", "description": "benchmark"}).encode()


def environ(path: str, key: str | None) -> dict[str, object]:
    """A POST as gunicorn hands it to Django."""
    env: dict[str, object] = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": path,
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "localhost",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(BODY)),
        "wsgi.input": io.BytesIO(BODY),
        "wsgi.url_scheme": "http",
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,  # One process: the memory store variants refuse several.
        "wsgi.run_once": False,
        "wsgi.version": (1, 0),
    }
    if key is not None:
        env["HTTP_IDEMPOTENCY_KEY"] = key
    return env


def backend_cpu() -> Callable[[], float]:
    """CPU seconds the server process of the default connection has used (PostgreSQL on this
    machine only; 0 elsewhere)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return lambda: 0.0
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]

    def read() -> float:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:  # The server runs elsewhere, or as another user's hidden process.
            return 0.0
        return sum(int(value) for value in fields[11:13]) / os.sysconf("SC_CLK_TCK")

    return read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=1000, help="per variant and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", help="print the cProfile of this variant (its name)")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--sort", default="cumulative", help="a pstats sort key, e.g. tottime")
    parser.add_argument("--restrict", nargs="*", default=[], help="e.g. django_idempotency")
    parser.add_argument("--callees", help="print what the functions matching this call instead")
    parser.add_argument("--dump", help="also save the profile to this file (for pstats)")
    parser.add_argument(
        "--calls",
        action="store_true",
        help="count the Python function calls per request instead of timing (deterministic)",
    )
    parser.add_argument("--only", nargs="*", help="these variants (names) only")
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    os.environ.setdefault("DJANGO_DEBUG", "0")
    os.environ.setdefault("CONN_MAX_AGE", "600")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.handlers.wsgi import WSGIHandler
    from django.core.management import call_command
    from django.test import override_settings

    call_command("migrate", verbosity=0)
    handler = WSGIHandler()
    run = uuid.uuid4().hex[:8]
    replayed = f"profile-{run}"

    def call(path: str, key: str | None) -> None:
        statuses: list[str] = []
        body = handler(environ(path, key), lambda status, headers, *_: statuses.append(status))
        b"".join(body)
        getattr(body, "close", lambda: None)()
        assert statuses[0][:3] in ("200", "201"), (path, statuses, b"".join(body))

    counter = iter(range(10**9))
    cached = {"IDEMPOTENCY_CACHE": "idempotency"}
    memory = {"IDEMPOTENCY_STORE": "django_idempotency.stores.memory.MemoryStore"}
    redis = {  # The Redis store (lease mode only), on the cache alias REDIS_URL names.
        "IDEMPOTENCY_STORE": "django_idempotency.stores.redis.RedisStore",
        "IDEMPOTENCY_REDIS_CACHE": "idempotency",
    }
    variants: dict[str, tuple[Callable[[], None], dict[str, object]]] = {
        "plain": (lambda: call("/api/bench/plain/", None), {}),
        # The plain create sent a key: the same as plain here, a peer's guard under
        # DJANGO_SETTINGS_MODULE=benchmarks.peer_settings (benchmarks/peers.py).
        "plain-fresh-key": (lambda: call("/api/bench/plain/", f"p-{run}-{next(counter)}"), {}),
        "plain-replay-key": (lambda: call("/api/bench/plain/", f"plain-{replayed}"), {}),
        "recorded": (lambda: call("/api/bench/recorded/", None), {}),
        "floor": (lambda: call("/api/bench/floor/", None), {}),
        "fresh-atomic": (lambda: call("/api/payments/", f"f-{run}-{next(counter)}"), {}),
        "fresh-lease": (lambda: call("/api/bench/lease/", f"l-{run}-{next(counter)}"), {}),
        "fresh-atomic-cache": (
            lambda: call("/api/payments/", f"c-{run}-{next(counter)}"),
            cached,
        ),
        "replay": (lambda: call("/api/payments/", replayed), {}),
        # The guard's own Python, with a store that costs almost nothing (per process, no I/O).
        "fresh-memory": (lambda: call("/api/bench/lease/", f"m-{run}-{next(counter)}"), memory),
        "replay-memory": (lambda: call("/api/bench/lease/", f"lease-{replayed}"), memory),
        "replay-cache": (lambda: call("/api/payments/", replayed), cached),
        "fresh-redis": (lambda: call("/api/bench/lease/", f"r-{run}-{next(counter)}"), redis),
        "replay-redis": (lambda: call("/api/bench/lease/", f"lease-{replayed}"), redis),
    }
    call("/api/payments/", replayed)
    call("/api/bench/plain/", f"plain-{replayed}")
    for store in (memory, redis):
        with override_settings(**store):
            call("/api/bench/lease/", f"lease-{replayed}")
    server = backend_cpu()
    if args.profile:
        action, settings = variants[args.profile]
        with override_settings(**settings):
            for _ in range(200):
                action()
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(args.requests):
                action()
            profiler.disable()
        out = io.StringIO()
        if args.dump:
            profiler.dump_stats(args.dump)
        stats = pstats.Stats(profiler, stream=out).sort_stats(args.sort)
        if args.callees:
            stats.print_callees(args.callees)
        else:
            stats.print_stats(*args.restrict, args.top)
        print(out.getvalue())
        return
    chosen = {name: v for name, v in variants.items() if not args.only or name in args.only}
    if args.calls:
        print_call_counts(chosen, args.requests)
        return
    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in chosen}
    for _ in range(args.rounds):  # Interleaved, so drift on the machine hits every variant.
        for name, (action, settings) in chosen.items():
            with override_settings(**settings):
                for _ in range(100):  # Warm: prepared statements, caches, connection.
                    action()
                wall, cpu, db = time.perf_counter(), time.process_time(), server()
                for _ in range(args.requests):
                    action()
                samples[name].append(
                    (
                        (time.process_time() - cpu) * 1000 / args.requests,
                        (server() - db) * 1000 / args.requests,
                        (time.perf_counter() - wall) * 1000 / args.requests,
                    )
                )
    print("| variant | client CPU ms | database CPU ms | total CPU ms | wall ms |")
    print("|---|---:|---:|---:|---:|")
    for name, measured in samples.items():
        client, db, wall = (statistics.median(column) for column in zip(*measured, strict=True))
        print(f"| {name} | {client:.3f} | {db:.3f} | {client + db:.3f} | {wall:.3f} |")


# Modules a request that uses none of them should not reach: steps, the outbound client and the
# heartbeat (a lease-mode claim holds and ends a renewal; an atomic one touches nothing).
OPT_IN = (
    "django_idempotency/steps.py",
    "django_idempotency/outbound/",
    "django_idempotency/leases.py",
)


def print_call_counts(
    chosen: dict[str, tuple[Callable[[], None], dict[str, object]]], n: int
) -> None:
    """Python function calls per request, counted by cProfile: the same on every run of the same
    code, so a change to the guard's own work shows however noisy the machine's timings are."""
    from django.test import override_settings

    print("| variant | calls | in django_idempotency | in steps, outbound, leases |")
    print("|---|---:|---:|---:|")
    for name, (action, settings) in chosen.items():
        with override_settings(**settings):
            for _ in range(100):
                action()
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(n):
                action()
            profiler.disable()
        stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
        counts = {"all": 0, "package": 0, "opt-in": 0}
        for (filename, _, _), (_, calls, *_) in stats.items():
            counts["all"] += calls
            if "django_idempotency/" in filename:
                counts["package"] += calls
            if any(part in filename for part in OPT_IN):
                counts["opt-in"] += calls
        print(
            f"| {name} | {counts['all'] / n:.0f} | {counts['package'] / n:.0f} "
            f"| {counts['opt-in'] / n:.0f} |"
        )


if __name__ == "__main__":
    main()
