"""The same endpoint guarded by this package and by the packages a team would otherwise pick."""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import uuid
from dataclasses import dataclass

from bench import PLAIN, REDIS_STORE, ROOT, Sample, Variant, gunicorn, seed, server_pids, wrk

# What benchmarks/run installs for this run, beside this package (pinned: a figure names the
# version it measured).
PEER_PACKAGES = ("drf-idempotency==1.0.0", "django-idempotency-key==1.3.0")


@dataclass(frozen=True)
class Guard:
    name: str
    server: str  # the gunicorn serving it (SERVERS)
    path: str
    # Answers a replay only after DRF's authentication and permissions (SPEC §8 compares
    # replays only among guards that do).
    authenticates_first: bool


OURS_DATABASE = "this package, database store, atomic"
OURS_REDIS = "this package, Redis store (lease)"
GUARDS = [
    Guard(OURS_DATABASE, "db", "/api/payments/", True),
    Guard(OURS_REDIS, "redis", "/api/payments/", True),
    # The peers guard the demo's plain create, set up as their READMEs say
    # (benchmarks/peer_settings.py): each a middleware, answering before DRF runs.
    Guard("drf-idempotency 1.0.0, RedisBackend", "drf-idempotency-redis", PLAIN.path, False),
    Guard("drf-idempotency 1.0.0, DatabaseBackend", "drf-idempotency-database", PLAIN.path, False),
    Guard(
        "django-idempotency-key 1.3.0, cache storage and lock in Redis",
        "django-idempotency-key",
        PLAIN.path,
        False,
    ),
]
PEER_SETTINGS = "benchmarks.peer_settings"
SERVERS = {
    "db": {"IDEMPOTENCY_CACHE": ""},
    "redis": {"IDEMPOTENCY_CACHE": "", **REDIS_STORE},
    **{
        guard.server: {"DJANGO_SETTINGS_MODULE": PEER_SETTINGS, "BENCH_PEER": guard.server}
        for guard in GUARDS
        if not guard.authenticates_first
    },
}
# Request mixes, by the wrk.lua mode that sends them: a new key each, 95 % new and 5 % retries,
# and replays of completed keys.
PATHS = {"fresh": "unique", "mix": "mix", "replay": "pool"}


def migrate_peers() -> None:
    """The peers' own tables (drf-idempotency's database backend keeps its records in one)."""
    for settings in SERVERS.values():
        if settings.get("DJANGO_SETTINGS_MODULE") == PEER_SETTINGS:
            subprocess.run(
                [sys.executable, "-m", "django", "migrate", "--verbosity", "0"],
                cwd=ROOT,
                env={**os.environ, **settings},
                check=True,
            )


def ratio(samples: list[Sample], against: list[Sample]) -> tuple[float, float]:
    """Median over rounds of the throughput ratio and of the CPU ratio (against's CPU per
    request over samples'), each pair measured in the same round."""
    pairs = list(zip(samples, against, strict=True))
    return (
        statistics.median(s.rps / a.rps for s, a in pairs),
        statistics.median(a.cpu_ms / s.cpu_ms for s, a in pairs),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=6, help="per variant and round")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--database", choices=("postgresql", "mariadb"), default="postgresql")
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    migrate_peers()
    run_id = uuid.uuid4().hex[:8]
    variants = {(guard.name, path): guard for guard in GUARDS for path in PATHS}
    results: dict[object, list[Sample]] = {key: [] for key in [PLAIN.name, *variants]}
    with contextlib.ExitStack() as stack:
        served = {
            name: stack.enter_context(gunicorn(8201 + number, settings))
            for number, (name, settings) in enumerate(SERVERS.items())
        }
        servers = server_pids(args.database)
        for guard in GUARDS:
            seed(served[guard.server][0], f"replay-{guard.server}-{run_id}", guard.path)
        for round_number in range(args.rounds):  # Interleaved: drift hits every variant alike.
            url, pid = served["db"]
            plain = wrk(url, PLAIN, "", args.seconds, args.connections, [pid, *servers])
            results[PLAIN.name].append(plain)
            for (name, path), guard in variants.items():
                url, pid = served[guard.server]
                mode = PATHS[path]
                prefix = f"{'replay' if mode == 'pool' else path}-{guard.server}-{run_id}"
                if mode != "pool":
                    prefix += f"-{round_number}"
                variant = Variant(name, guard.server, guard.path, mode)
                sample = wrk(url, variant, prefix, args.seconds, args.connections, [pid, *servers])
                results[(name, path)].append(sample)
                print(f"round {round_number + 1}, {name}, {path}: {sample.rps:.0f} req/s")
    print_tables(results, args.database)


def print_tables(results: dict[object, list[Sample]], database: str) -> None:
    plain = results[PLAIN.name]
    print(f"\nDatabase: {database}. Plain create: {statistics.median(s.rps for s in plain):.0f}")
    print(f"req/s, {statistics.median(s.cpu_ms for s in plain):.2f} ms CPU per request.")
    print(
        "\n| guard | replays after authentication | fresh / plain | fresh CPU ms "
        "| mix / plain | mix CPU ms | replay / plain | replay CPU ms | non-2xx |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for guard in GUARDS:
        cells = []
        failed = 0
        for path in PATHS:
            samples = results[(guard.name, path)]
            cells.append(f"{ratio(samples, plain)[0]:.2f}")
            cells.append(f"{statistics.median(s.cpu_ms for s in samples):.2f}")
            failed += sum(s.non_2xx + s.socket_errors for s in samples)
        first = "yes" if guard.authenticates_first else "no"
        print(f"| {guard.name} | {first} | {' | '.join(cells)} | {failed} |")
    print(
        "\nEach of this package's stores against each peer, same path, same rounds "
        "(throughput ratio, CPU ratio; above 1: this package ahead):\n"
        "\n| this package | peer | fresh | mix | replay |\n|---|---|---:|---:|---:|"
    )
    for ours in (guard for guard in GUARDS if guard.authenticates_first):
        for peer in (guard for guard in GUARDS if not guard.authenticates_first):
            cells = []
            for path in PATHS:
                rps, cpu = ratio(results[(ours.name, path)], results[(peer.name, path)])
                cells.append(f"{rps:.2f}, {cpu:.2f}")
            print(f"| {ours.name} | {peer.name} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
