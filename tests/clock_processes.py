"""Processes for the clock, stall and lookup tests: one whose wall clock is off, trying a key
held in lease mode, one holding a key, and one paying in two steps with a pause between them
(where the test stops it).

    python -m tests.clock_processes ahead KEY MARKER SKEW TRIES
    python -m tests.clock_processes hold KEY MARKER SECONDS
    python -m tests.clock_processes two-steps KEY EFFECTS

The store comes from CLOCK_TEST_STORE ("database" or "redis"; on Redis, the records under the
key prefix CLOCK_TEST_REDIS_PREFIX, the test process's own); the database from DATABASE_URL.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import quote

from django_idempotency import idempotent_function
from django_idempotency.steps import step

LEASE = 1.0  # Seconds: renewed while its process runs, a third of the way through.
# The lease of `hold`: the holder's heartbeat may be late by a third of it (a loaded machine)
# before a server whose clock is right would take the key over.
HOLD_LEASE = 2.0


@idempotent_function(key="key", payload=["key"], mode="lease", lease=HOLD_LEASE)
def hold(key: str, marker: str, seconds: float) -> str:
    """Say (by creating `marker`) that this process holds the key, then work for `seconds`,
    or until `marker`.done exists."""
    Path(marker).touch()
    done, deadline = Path(f"{marker}.done"), time.monotonic() + seconds
    while time.monotonic() < deadline and not done.exists():
        time.sleep(0.01)
    return "held"


@idempotent_function(key="key", payload=["key"], mode="lease", lease=LEASE)
def pay_in_two_steps(key: str, effects: str) -> str:
    """Charge, then ship: each step leaves its effect in a file of `effects` (one line per run,
    the process's id). Between them, say so (`between`) and wait for `go`: where the test
    stops the process for longer than its lease."""
    folder = Path(effects)
    step("charge", effect, effects, "charge")
    (folder / "between").touch()
    while not (folder / "go").exists():
        time.sleep(0.001)
    step("ship", effect, effects, "ship")
    return "done"


def effect(effects: str, name: str) -> str:
    """A side effect that leaves its trace: a line with this process's id in `effects/name`."""
    with open(Path(effects) / name, "a") as trace:
        trace.write(f"{os.getpid()}\n")
    return name


def traces(effects: Path, name: str) -> list[int]:
    """The ids of the processes that ran the effect `name`, once per run."""
    path = effects / name
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def environment(store: str) -> dict[str, str]:
    """What a process of this module needs to use the test's own store and database."""
    from django.conf import settings
    from django.db import connection

    env = {
        "DJANGO_SETTINGS_MODULE": "tests.settings",  # Unless the run names its own.
        **os.environ,
        "DATABASE_URL": _database_url(connection.settings_dict, connection.vendor),
        "CLOCK_TEST_STORE": store,
    }
    if store == "redis":
        env["CLOCK_TEST_REDIS_PREFIX"] = settings.CACHES["idempotency"]["KEY_PREFIX"]
    return env


def _database_url(database: dict[str, Any], vendor: str) -> str:
    if vendor == "sqlite":
        return f"sqlite:///{database['NAME']}"
    user = quote(database["USER"]) + (
        f":{quote(database['PASSWORD'])}" if database["PASSWORD"] else ""
    )
    scheme = "mysql" if vendor == "mysql" else "postgres"
    return f"{scheme}://{user}@{database['HOST']}:{database['PORT']}/{database['NAME']}"


@contextmanager
def _the_tests_store() -> Iterator[None]:
    from django.test import override_settings

    from tests.stores import redis_settings

    if os.environ.get("CLOCK_TEST_STORE") != "redis":
        yield
        return
    overrides = redis_settings()
    overrides["CACHES"]["idempotency"]["KEY_PREFIX"] = os.environ["CLOCK_TEST_REDIS_PREFIX"]
    with override_settings(**overrides):
        yield


@contextmanager
def wall_clock_ahead(by: timedelta) -> Iterator[None]:
    """This process's wall clock, as Python code reads it, `by` ahead of everyone else's."""
    from django.utils import timezone

    seconds, now = by.total_seconds(), timezone.now
    wall, wall_ns = time.time, time.time_ns
    with (
        mock.patch.object(time, "time", lambda: wall() + seconds),
        mock.patch.object(time, "time_ns", lambda: wall_ns() + int(seconds * 1e9)),
        mock.patch.object(timezone, "now", lambda: now() + by),
    ):
        yield


def _ahead(key: str, marker: str, skew: float, tries: int) -> list[str]:
    """Try to claim `key` `tries` times, a third of a lease apart, on a clock `skew` seconds
    ahead: what each try met ("ran": this process took the key over and ran the work)."""
    from django_idempotency.exceptions import KeyInProgress

    met = []
    with wall_clock_ahead(timedelta(seconds=skew)):
        for _ in range(tries):
            try:
                hold(key, marker, 0)
            except KeyInProgress:
                met.append("in-progress")
            else:
                ran = Path(marker).exists()
                met.append("ran" if ran else "replayed")
                Path(marker).unlink(missing_ok=True)
            time.sleep(HOLD_LEASE / 3)
    return met


def main(role: str, key: str, *args: str) -> None:
    import django

    django.setup()
    # Imported by its name, not run as __main__: the label of the functions, and with it their
    # records' path, is then the one the test process calls them by.
    from django_idempotency.exceptions import LeaseLost
    from tests import clock_processes

    with _the_tests_store():
        if role == "ahead":
            print(json.dumps(clock_processes._ahead(key, args[0], float(args[1]), int(args[2]))))
        elif role == "hold":
            print(clock_processes.hold(key, args[0], float(args[1])))
        elif role == "two-steps":
            try:
                print(clock_processes.pay_in_two_steps(key, args[0]))
            except LeaseLost:
                print("lease-lost")
        else:
            raise SystemExit(f"unknown role {role!r}")
    sys.stdout.flush()


if __name__ == "__main__":
    main(*sys.argv[1:])
