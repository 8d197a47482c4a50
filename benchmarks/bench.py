"""Measure idempotent endpoints against the same endpoint without idempotency, in one run."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WRK_SCRIPT = Path(__file__).with_name("wrk.lua")
BODY = {"amount": 100, "currency": "EUR", "description": "benchmark"}
POOL = 200  # Keys the replay variants cycle through.


@dataclass(frozen=True)
class Variant:
    name: str
    server: str  # "db", "cache" or "redis": which gunicorn serves it (see SERVERS)
    path: str
    mode: str  # wrk.lua key mode
    prefix: str = ""
    # SPEC §8: at least `budget` times the throughput of the variant named `measured_against`.
    measured_against: str = ""
    budget: float = 0.0


PLAIN = Variant("plain create (no idempotency)", "db", "/api/bench/plain/", "none")
RECORDED = "yardstick: plain create + its record in one transaction"
FLOOR = "yardstick: the view stack answering at once"
FRESH_ATOMIC = "idempotent, fresh keys, atomic"
# The settings of each gunicorn the variants are served by, beside the demo's own.
REDIS_STORE = {  # testproject/settings.py reads them from the environment.
    "IDEMPOTENCY_STORE": "django_idempotency.stores.redis.RedisStore",
    "IDEMPOTENCY_MODE": "lease",  # The Redis store has no atomic mode.
}
SERVERS = {
    "db": {"IDEMPOTENCY_CACHE": ""},
    "cache": {"IDEMPOTENCY_CACHE": "idempotency"},
    "redis": {"IDEMPOTENCY_CACHE": "", **REDIS_STORE},
}
CACHED_REPLAY = Variant(
    "replay from the cache tier", "cache", "/api/payments/", "pool", "replay", FLOOR, 0.75
)
VARIANTS = [
    PLAIN,
    # Yardsticks: the cheapest a correct guard could possibly be (testproject/payments/views.py).
    Variant(RECORDED, "db", "/api/bench/recorded/", "none"),
    Variant(FLOOR, "db", "/api/bench/floor/", "none"),
    Variant(FRESH_ATOMIC, "db", "/api/payments/", "unique", "", RECORDED, 0.90),
    Variant(
        "idempotent, fresh keys, lease", "db", "/api/bench/lease/", "unique", "", RECORDED, 0.85
    ),
    # The cache tier's write-through on its own row: at most 5 % off the same mode without it.
    Variant(
        "idempotent, fresh keys, atomic, cache tier on",
        "cache",
        "/api/payments/",
        "unique",
        "cached",
        FRESH_ATOMIC,
        0.95,
    ),
    Variant("replay from the database", "db", "/api/payments/", "pool", "replay", FLOOR, 0.65),
    CACHED_REPLAY,
    Variant(
        "Redis store, fresh keys", "redis", "/api/payments/", "unique", "redis", PLAIN.name, 0.75
    ),
    Variant("Redis store, replay", "redis", "/api/payments/", "pool", "replay", FLOOR, 0.75),
    Variant("409 conflict (key in progress)", "db", "/api/bench/lease/", "fixed", "busy"),
]


@dataclass(frozen=True)
class Sample:
    rps: float
    p50: float
    p95: float
    p99: float
    non_2xx: int
    socket_errors: int
    cpu_ms: float = 0.0  # CPU of every process involved (servers, load generator), per request


def cpu_seconds(root_pids: list[int]) -> float:
    """User + system CPU of these processes and their children, reaped ones included."""
    ticks = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = _stat(int(entry))
        except OSError:  # Gone meanwhile.
            continue
        if int(entry) in root_pids or int(fields[1]) in root_pids:
            ticks += sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat after the command name: fields 3 onwards (state, ppid, ...)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()


def server_pids(database: str) -> list[int]:
    """The database server (PostgreSQL's postmaster or mariadbd) and the Redis server started
    by benchmarks/run."""
    services = Path(os.environ["SERVICES_DIR"])
    database_pid = {
        "postgresql": services / "postgres" / "postmaster.pid",
        "mariadb": services / "mariadb" / "mariadb.pid",
    }[database]
    return [
        int(pid_file.read_text().split()[0])
        for pid_file in (database_pid, services / "redis" / "redis.pid")
    ]


def wrk(
    url: str, variant: Variant, prefix: str, seconds: int, connections: int, pids: list[int]
) -> Sample:
    command = [
        "wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s",
        "-s", str(WRK_SCRIPT), url + variant.path, "--", variant.mode, prefix, str(POOL),
    ]  # fmt: skip
    cpu_before, children_before = cpu_seconds(pids), os.times()
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    children = os.times()
    cpu = cpu_seconds(pids) - cpu_before
    cpu += children.children_user + children.children_system  # wrk itself
    cpu -= children_before.children_user + children_before.children_system
    result = json.loads(output.split("RESULT ", 1)[1])
    return Sample(
        rps=result["requests"] / (result["duration_us"] / 1e6),
        p50=result["p50_us"] / 1000,
        p95=result["p95_us"] / 1000,
        p99=result["p99_us"] / 1000,
        non_2xx=result["non_2xx"],
        socket_errors=result["socket_errors"],
        cpu_ms=cpu * 1000 / max(result["requests"], 1),
    )


@contextmanager
def gunicorn(port: int, extra_env: dict[str, str]) -> Iterator[tuple[str, int]]:
    env = {**os.environ, "DJANGO_DEBUG": "0", "CONN_MAX_AGE": "60", **extra_env}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "testproject.wsgi",
            "--workers",
            "2",
            "--worker-class",
            "gthread",
            "--threads",
            "4",
            "--bind",
            f"127.0.0.1:{port}",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/api/", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        yield url, process.pid
    finally:
        process.terminate()
        process.wait(timeout=10)


def seed(url: str, prefix: str, path: str = "/api/payments/") -> None:
    """Complete the POOL keys the replay variants replay."""
    for number in range(POOL):
        request = urllib.request.Request(
            url + path,
            data=json.dumps(BODY).encode(),
            headers={"Content-Type": "application/json", "Idempotency-Key": f"{prefix}-{number}"},
        )
        urllib.request.urlopen(request, timeout=10).read()


def hold_busy_key(key: str) -> None:
    """An in-progress claim with a long lease, so every request for it is a 409."""
    from django.utils import timezone

    from django_idempotency.core.fingerprint import canonical_json, fingerprint
    from django_idempotency.core.outcomes import Scope
    from django_idempotency.stores import ClaimRequest, get_store

    get_store().begin(
        ClaimRequest(
            scope=Scope("payments-lease", "", key),
            fingerprint=fingerprint("POST", "/api/bench/lease/", canonical_json(BODY)),
            method="POST",
            path="/api/bench/lease/",
            now=timezone.now(),
            ttl=timedelta(hours=1),
            lease=timedelta(hours=1),
        )
    )


def statements_per_request(busy_key: str) -> dict[str, str]:
    """SQL each variant runs, counted in-process on the same database ("2 + 2": + BEGIN/COMMIT)."""
    from django.core.cache import caches
    from django.db import connection
    from django.test import Client, override_settings
    from django.test.utils import CaptureQueriesContext

    def count(path: str, key: str | None, **settings: object) -> str:
        headers = {"Idempotency-Key": key} if key else {}
        with (
            override_settings(**settings),
            CaptureQueriesContext(connection) as captured,
            round_trips(connection) as trips,
        ):
            response = Client(SERVER_NAME="localhost").post(
                path, json.dumps(BODY), content_type="application/json", headers=headers
            )
        assert response.status_code in (201, 409), response.content
        sql = [query["sql"] for query in captured.captured_queries]
        control = sum(statement in ("BEGIN", "COMMIT", "ROLLBACK") for statement in sql)
        counted = f"{len(sql) - control} + {control}" if control else str(len(sql))
        return f"{counted} ({trips[0]})" if trips else counted

    # Persistent connection and a warm-up request: count the requests' statements, not the
    # connection set-up (SET TIME ZONE) a fresh connection runs once.
    connection.settings_dict["CONN_MAX_AGE"] = None
    count(PLAIN.path, None)
    completed = f"count-{uuid.uuid4()}"  # The key the replay variants replay.
    count("/api/payments/", completed)
    cached = {"IDEMPOTENCY_CACHE": "idempotency"}
    count("/api/payments/", completed, **cached)  # Fills the cache from the database.
    in_redis = {**REDIS_STORE, "IDEMPOTENCY_REDIS_CACHE": "idempotency"}
    count("/api/payments/", completed, **in_redis)  # The Redis store's copy of the record.
    counts = {}
    for variant in VARIANTS:
        key = {"unique": f"count-{uuid.uuid4()}", "pool": completed, "fixed": busy_key}
        settings = {"cache": cached, "redis": in_redis}.get(variant.server, {})
        counts[variant.name] = count(variant.path, key.get(variant.mode), **settings)
    caches["idempotency"].clear()
    return counts


@contextmanager
def round_trips(connection: object) -> Iterator[list[int]]:
    """The round trips a PostgreSQL connection makes meanwhile, from libpq's protocol trace:
    each run of messages the client sends that the server then answers. None elsewhere."""
    counted: list[int] = []
    raw = getattr(connection, "connection", None)
    if getattr(connection, "vendor", "") != "postgresql" or not hasattr(raw, "pgconn"):
        yield counted
        return
    import tempfile

    from psycopg import pq

    with tempfile.TemporaryFile("w+") as trace:
        raw.pgconn.trace(trace.fileno())
        raw.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield counted
        finally:
            raw.pgconn.untrace()
        trace.seek(0)
        directions = [line[0] for line in trace if line[:1] in ("F", "B")]
    counted.append(sum(a == "F" and b == "B" for a, b in itertools.pairwise(directions)))


def redis_outage(url: str, prefix: str, seconds: int, connections: int, pids: list[int]) -> Sample:
    """Replays from the cache tier while Redis is stopped halfway through."""
    port = os.environ["REDIS_URL"].rsplit(":", 1)[1].split("/")[0]
    stopper = subprocess.Popen(
        ["sh", "-c", f"sleep {seconds / 2}; redis-cli -p {port} shutdown nosave"]
    )
    sample = wrk(url, CACHED_REPLAY, prefix, seconds, connections, pids)
    stopper.wait()
    # Started again as benchmarks/run started it (its pid file is what server_pids reads).
    subprocess.run(["bash", "-c", "source scripts/services.sh; start_redis"], cwd=ROOT, check=True)
    return sample


def latency_at_scale(records: int, samples: int) -> dict[str, float]:
    """Median and p95 claim and replay latency (ms) with `records` rows in the table."""
    from django.db import connection
    from django.utils import timezone

    from django_idempotency.core.outcomes import Outcome, Scope, StoredResponse
    from django_idempotency.models import IdempotencyRecord
    from django_idempotency.stores import ClaimRequest, get_store

    table = IdempotencyRecord._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table} WHERE namespace = 'scale'")
        present = cursor.fetchone()[0]
        if present < records:
            # One statement, rows shaped like real completed records.
            cursor.execute(
                f"""INSERT INTO {table} (namespace, owner, key, fingerprint, status, method, path,
                    response_status, response_headers, response_body, lease_token, created_at,
                    completed_at, expires_at)
                SELECT 'scale', '', 'scale-' || n, md5(n::text) || md5(n::text), 'completed',
                    'POST', '/api/payments/', 201, '[["Content-Type", "application/json"]]',
                    convert_to('{{"id": ' || n || ', "amount": 100}}', 'UTF8'), md5(n::text),
                    now(), now(), now() + interval '30 days'
                FROM generate_series(%s, %s) AS n""",
                [present, records - 1],
            )
        cursor.execute(f"VACUUM ANALYZE {table}")
    store = get_store()

    def request(key: str, fingerprint: str) -> ClaimRequest:
        return ClaimRequest(
            scope=Scope("scale", "", key),
            fingerprint=fingerprint,
            method="POST",
            path="/api/payments/",
            now=timezone.now(),
            ttl=timedelta(hours=1),
            lease=timedelta(seconds=60),
        )

    def timed(action: Callable[[], None]) -> list[float]:
        durations = []
        for _ in range(samples):
            started = time.perf_counter()
            action()
            durations.append((time.perf_counter() - started) * 1000)
        return durations

    def claim() -> None:
        fresh = store.begin(request(f"fresh-{uuid.uuid4()}", "0" * 64))
        assert fresh.outcome is Outcome.FRESH
        store.complete(fresh, StoredResponse(201, [], b"{}"), timezone.now())

    def replay() -> None:
        n = random.randrange(records)
        digest = hashlib.md5(str(n).encode()).hexdigest()  # As the INSERT above made them.
        assert store.begin(request(f"scale-{n}", digest * 2)).outcome is Outcome.REPLAY

    claims, replays = timed(claim), timed(replay)
    IdempotencyRecord.objects.filter(key__startswith="fresh-").delete()
    return {
        "claim_p50": statistics.median(claims),
        "claim_p95": statistics.quantiles(claims, n=20)[-1],
        "replay_p50": statistics.median(replays),
        "replay_p95": statistics.quantiles(replays, n=20)[-1],
    }


def print_budgets(results: dict[str, list[Sample]]) -> None:
    """Each budgeted variant against what SPEC §8 measures it by, both measured in each round."""
    print(
        "\n| variant | measured against | budget | req/s ratio | CPU ratio | met |"
        "\n|---|---|---:|---:|---:|---|"
    )
    for variant in VARIANTS:
        if not variant.budget:
            continue
        pairs = list(zip(results[variant.name], results[variant.measured_against], strict=True))
        rps = statistics.median(s.rps / ref.rps for s, ref in pairs)
        cpu = statistics.median(ref.cpu_ms / s.cpu_ms for s, ref in pairs)
        met = "yes" if min(rps, cpu) >= variant.budget else "**no**"
        print(
            f"| {variant.name} | {variant.measured_against} | ≥ {variant.budget:.2f} "
            f"| {rps:.2f} | {cpu:.2f} | {met} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=8, help="per variant and round")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--large", type=int, default=10_000_000, help="records for the scale test")
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--skip-scale", action="store_true")
    parser.add_argument(
        "--database",
        choices=("postgresql", "mariadb"),
        default="postgresql",
        help="the database DATABASE_URL points at (the scale test runs on PostgreSQL only)",
    )
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    run_id = uuid.uuid4().hex[:8]
    busy_key = f"busy-{run_id}"
    hold_busy_key(busy_key)

    results: dict[str, list[Sample]] = {variant.name: [] for variant in VARIANTS}
    with contextlib.ExitStack() as stack:
        served = {
            name: stack.enter_context(gunicorn(8101 + number, settings))
            for number, (name, settings) in enumerate(SERVERS.items())
        }
        urls = {name: url for name, (url, _) in served.items()}
        # The CPU counted for a variant: its gunicorn, the database, Redis and wrk.
        servers = server_pids(args.database)
        pids = {name: [pid, *servers] for name, (_, pid) in served.items()}
        seed(urls["db"], f"replay-{run_id}")
        seed(urls["redis"], f"replay-{run_id}")  # The Redis store's records are its own.
        for round_number in range(args.rounds):
            for variant in VARIANTS:  # Interleaved: every round measures every variant.
                prefix = f"{variant.prefix or 'fresh'}-{run_id}"
                if variant.mode == "unique":
                    prefix += f"-{round_number}"
                sample = wrk(
                    urls[variant.server],
                    variant,
                    prefix,
                    args.seconds,
                    args.connections,
                    pids[variant.server],
                )
                results[variant.name].append(sample)
                print(f"round {round_number + 1}, {variant.name}: {sample.rps:.0f} req/s")
        outage = redis_outage(
            urls["cache"], f"replay-{run_id}", args.seconds, args.connections, pids["cache"]
        )

    statements = statements_per_request(busy_key)
    plain = results[PLAIN.name]
    # "CPU vs plain" is the throughput ratio the variant would reach with every process busy:
    # the plain endpoint's CPU per request over the variant's, which drifts less between rounds
    # than req/s does on a shared machine.
    print(f"\nDatabase: {args.database}")
    print(
        "\n| variant | req/s | p50 ms | p95 ms | p99 ms | vs plain | CPU ms/req | CPU vs plain "
        "| SQL (+ BEGIN/COMMIT) (round trips) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for variant in VARIANTS:
        samples = results[variant.name]
        ratios = [s.rps / p.rps for s, p in zip(samples, plain, strict=True)]
        cpu_ratios = [p.cpu_ms / s.cpu_ms for s, p in zip(samples, plain, strict=True)]
        print(
            f"| {variant.name} | {statistics.median(s.rps for s in samples):.0f} "
            f"| {statistics.median(s.p50 for s in samples):.1f} "
            f"| {statistics.median(s.p95 for s in samples):.1f} "
            f"| {statistics.median(s.p99 for s in samples):.1f} "
            f"| {statistics.median(ratios):.2f} "
            f"| {statistics.median(s.cpu_ms for s in samples):.2f} "
            f"| {statistics.median(cpu_ratios):.2f} | {statements[variant.name]} |"
        )
    print_budgets(results)
    errors = sum(s.socket_errors for samples in results.values() for s in samples)
    print(f"\nSocket errors over all runs: {errors}", flush=True)
    print(
        f"Redis stopped halfway through {args.seconds} s of cached replays: "
        f"{outage.rps:.0f} req/s, {outage.non_2xx} non-2xx, {outage.socket_errors} socket errors"
    )
    if not args.skip_scale and args.database == "postgresql":
        small = latency_at_scale(args.small, 2000)
        large = latency_at_scale(args.large, 2000)
        print(f"\n| store latency, ms | {args.small:,} records | {args.large:,} records | ratio |")
        print("|---|---:|---:|---:|")
        for name, value in small.items():
            print(f"| {name} | {value:.3f} | {large[name]:.3f} | {large[name] / value:.2f} |")


if __name__ == "__main__":
    main()
