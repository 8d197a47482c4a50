"""Scenario 1: concurrent identical requests, from several client processes, run once per key.

On the Redis store (lease mode only) the "atomic" variants run their endpoint in lease mode, the
demo's IDEMPOTENCY_MODE, and say so in their figures."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from tests.reliability.client import Answer, Race
from tests.reliability.harness import (
    Database,
    Figure,
    Figures,
    Records,
    Serve,
    Server,
    Services,
)

DUPLICATES = 16
PROCESSES = 8  # Client processes of DUPLICATES // PROCESSES threads each.
# Keys per configuration (mode, on_conflict), each sent DUPLICATES times at once.
VARIANTS = [
    ("atomic", "reject", 50),
    ("lease", "reject", 50),
    ("atomic", "wait", 50),
    ("lease", "wait", 50),
]
PATHS = {"atomic": "/api/provider/payments/", "lease": "/api/provider/lease/"}
NAMESPACES = {"atomic": "provider-payments", "lease": "provider-payments-lease"}
# The provider takes 50 ms: long enough that most duplicates arrive while the first still runs.
BODY = {"amount": 100, "currency": "EUR", "delay": 0.05}


@pytest.fixture(scope="module")
def waiting_server(serve: Serve) -> Iterator[Server]:
    with serve("wait", IDEMPOTENCY_ON_CONFLICT="wait", IDEMPOTENCY_WAIT_TIMEOUT="10") as running:
        yield running


@pytest.mark.parametrize(("mode", "on_conflict", "keys"), VARIANTS)
def test_concurrent_duplicates_run_once_and_every_other_answer_is_a_replay_or_409(
    request: pytest.FixtureRequest,
    services: Services,
    db: Database,
    store: Records,
    figures: Figures,
    timer: Callable[[], float],
    mode: str,
    on_conflict: str,
    keys: int,
) -> None:
    server: Server = request.getfixturevalue(
        "server" if on_conflict == "reject" else "waiting_server"
    )
    prefix = f"race-{mode}-{on_conflict}-"
    names = [f"{prefix}{number:04}" for number in range(keys)]
    deadlocks_before = db.deadlocks()
    started = time.monotonic()

    answers = Race(server.url, PATHS[mode], BODY, DUPLICATES, PROCESSES).run(names)

    seconds = time.monotonic() - started
    executions = db.executions(prefix)
    tally: Counter[str] = Counter(_kind(a) for group in answers.values() for a in group)
    # A deadlock the database broke (InnoDB 1213, PostgreSQL's "deadlock detected") must never
    # reach a client, whatever status it would come with.
    deadlocks = [a for group in answers.values() for a in group if b"eadlock" in a.body]
    broken = db.deadlocks() - deadlocks_before  # Told to a client or not.
    # The Redis store runs every view leased: the atomic endpoint too (IDEMPOTENCY_MODE=lease).
    run_as = mode if services.store == "database" else f"lease ({mode} endpoint {PATHS[mode]})"
    figures.add(
        Figure(
            "1. races",
            f"{run_as}, on_conflict={on_conflict}, {keys} keys x {DUPLICATES} "
            f"from {PROCESSES} processes",
            requests=sum(len(group) for group in answers.values()),
            absorbed=tally["replay"] + tally["409"],
            executions=_spread(executions, names),
            server_errors=sum(n for kind, n in tally.items() if kind.startswith("5")),
            seconds=seconds,
            notes=", ".join(f"{kind}: {n}" for kind, n in sorted(tally.items()))
            + f"; deadlock errors: {len(deadlocks)} (deadlocks in the database: {broken})",
        )
    )
    assert not deadlocks, str(deadlocks[0])
    assert {executions.get(name, 0) for name in names} == {1}, _spread(executions, names)
    records = store.records(NAMESPACES[mode], prefix)
    if store is not db:  # The records are in Redis alone: the run was on the Redis store.
        assert len(records) == keys
        assert not db.records(NAMESPACES[mode], prefix)
    for name, group in answers.items():
        assert len(group) == DUPLICATES, name
        fresh = [a for a in group if a.status == 201 and not a.replayed]
        assert len(fresh) == 1, [str(a) for a in group]
        first = fresh[0]
        for answer in group:
            if answer is first:
                continue
            if answer.status == 409 and on_conflict == "reject":
                assert answer.problem()["type"].endswith("request-in-progress"), answer
            else:
                assert (answer.status, answer.replayed, answer.body) == (201, True, first.body), (
                    answer
                )
        # The stored response is the one the first request got.
        assert records[("", name)][:3] == ("completed", 201, first.body), name


def _kind(answer: Answer) -> str:
    if answer.status == 201 and answer.replayed:
        return "replay"
    if answer.status == 201:
        return "executed"
    return str(answer.status) if answer.status else "no response"


def _spread(executions: dict[str, int], names: list[str]) -> str:
    counts = [executions.get(name, 0) for name in names]
    return f"{min(counts)}..{max(counts)}" if min(counts) != max(counts) else str(counts[0])
