"""Measure the durable layer on PostgreSQL: steps, outbox messages written and relayed, recoveries.

    DATABASE_URL=postgres://postgres@127.0.0.1:54329/idempotency python benchmarks/durable.py

In a throw-away database of its own, from one thread: round trips (statements) and time per
step, per outbox message written and relayed, and per recovered call, each against the same
work without it, in one run. Prints a table; stops by itself.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Measured:
    """One measured loop: wall and this process's CPU time, and the statements it sent."""

    wall: float
    cpu: float
    statements: int


def measure(loop: Callable[[], Any]) -> Measured:
    from django.db import connection

    sent = 0

    def count(execute: Callable[..., Any], *args: Any) -> Any:
        nonlocal sent
        sent += 1
        return execute(*args)

    with connection.execute_wrapper(count):
        wall, cpu = time.perf_counter(), time.process_time()
        loop()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return Measured(wall, cpu, sent)


def row(what: str, base: Measured, with_it: Measured, per: int) -> str:
    """The cost of one unit (`per` of them in the loop) over the baseline loop."""
    wall = (with_it.wall - base.wall) / per * 1000
    cpu = (with_it.cpu - base.cpu) / per * 1000
    statements = (with_it.statements - base.statements) / per
    rate = per / max(with_it.wall - base.wall, 1e-9)
    return f"| {what} | {statements:.2f} | {wall:.3f} | {cpu:.3f} | {rate:,.0f} |"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200, help="calls per measured loop")
    parser.add_argument("--steps", type=int, default=10, help="steps per call")
    parser.add_argument("--messages", type=int, default=2000, help="outbox messages")
    options = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.db import connection

    if connection.vendor != "postgresql":
        sys.exit("Set DATABASE_URL to a PostgreSQL database: this benchmark measures PostgreSQL.")
    connection.settings_dict["TEST"]["NAME"] = f"idempotency_durable_bench_{os.getpid()}"
    original_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        print(
            f"PostgreSQL {connection.pg_version // 10000}, {os.cpu_count()} cores, one thread; "
            f"{options.calls} calls of {options.steps} steps, {options.messages:,} messages; "
            f"load average {os.getloadavg()[0]:.1f}"
        )
        print()
        print("| what | statements each | ms each (wall) | ms each (CPU here) | per second |")
        print("|---|---|---|---|---|")
        for line in run(options):
            print(line)
    finally:
        connection.creation.destroy_test_db(original_name, verbosity=0)


def run(options: Any) -> list[str]:
    from django.db import transaction

    from benchmarks import durable_work as work
    from django_idempotency.models import OutboxMessage
    from django_idempotency.outbox import Relay, enqueue_task
    from django_idempotency.recovery import recover_operations
    from django_idempotency.testing import CrashPoint, crash_at

    lines = []
    calls, steps = options.calls, options.steps

    # Steps: the same lease-mode call with and without its steps.
    work.call_without_steps("warm-up")
    base = measure(lambda: [work.call_without_steps(f"a{i}") for i in range(calls)])
    stepped = measure(lambda: [work.call_with_steps(f"b{i}", steps) for i in range(calls)])
    lines.append(row("a step (lease mode, stored)", base, stepped, calls * steps))

    relay = Relay(app=work.celery_app, batch_size=100)
    nothing = measure(relay.run)  # An empty outbox: one look.

    # Outbox messages written: the same transaction with and without one message.
    def orders(with_message: bool) -> None:
        for i in range(options.messages):
            with transaction.atomic():
                work.place_order(i)
                if with_message:
                    enqueue_task("benchmarks.durable_work.confirm", args=(i,))

    base = measure(lambda: orders(False))
    written = measure(lambda: orders(True))
    lines.append(row("an outbox message written", base, written, options.messages))

    # Relayed: task messages published through Celery to an in-memory broker.
    relayed = measure(relay.run)
    pending = OutboxMessage.objects.filter(state=OutboxMessage.State.PENDING).count()
    assert pending == 0, f"{pending} messages left pending"
    lines.append(row("an outbox message relayed (task)", nothing, relayed, options.messages))

    # Recoveries: calls abandoned after their first step, then called again by the sweep.
    nothing_due = measure(lambda: recover_operations(batch_size=calls))  # Nothing kept yet.
    for i in range(calls):
        with crash_at("step.saved:first"), _quietly(CrashPoint):
            work.recoverable(f"r{i}", 1)
    work.expire_leases()  # Ended already (the crash raised), as a killed worker's would end.
    recovered = measure(lambda: recover_operations(batch_size=calls))
    done = sum(1 for i in range(calls) if work.completed(f"r{i}"))
    assert done == calls, f"{calls - done} calls not recovered"
    lines.append(row("a recovered call (the sweep, its resume)", nothing_due, recovered, calls))

    # What recover=True adds to a call that completes: its arguments kept, then deleted.
    plain = measure(lambda: [work.call_with_steps(f"c{i}", 1) for i in range(calls)])
    kept = measure(lambda: [work.recoverable(f"d{i}", 1) for i in range(calls)])
    lines.append(row("recover=True on a completed call", plain, kept, calls))
    return lines


class _quietly:
    def __init__(self, *errors: type[BaseException]) -> None:
        self.errors = errors

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        return kind is not None and issubclass(kind, self.errors)


if __name__ == "__main__":
    main()
