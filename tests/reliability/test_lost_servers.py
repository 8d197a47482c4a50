"""Scenario 3: Redis, then PostgreSQL, stopped in the middle of a run of requests."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
import redis

from tests.reliability.client import Answer, post
from tests.reliability.harness import Database, Figure, Figures, Serve, Server, Services

CLIENTS = 8
SEEDED = 50
BODY = {"amount": 250, "currency": "EUR"}
PATHS = {"atomic": "/api/payments/", "lease": "/api/bench/lease/"}


@dataclass(frozen=True)
class Sent:
    key: str
    path: str
    sent_at: float
    received_at: float
    answer: Answer


def _body(key: str) -> dict[str, object]:
    return {**BODY, "description": key}


def _seed(server: Server, prefix: str, path: str) -> dict[str, bytes]:
    """Completed keys whose replays the run sends: key -> the body of the first response."""
    bodies = {}
    for number in range(SEEDED):
        key = f"{prefix}seed-{number:03}"
        answer = post(server.url, path, _body(key), key)
        assert answer.status == 201, answer
        bodies[key] = answer.body
    return bodies


def _load(
    server: Server,
    prefix: str,
    paths: list[str],
    seeded: dict[str, bytes],
    seconds: float,
    during: Callable[[], None],
) -> list[Sent]:
    """CLIENTS threads send fresh keys and replays for `seconds`; `during` runs meanwhile."""
    counter = itertools.count()
    replays = itertools.cycle(sorted(seeded))
    lock = threading.Lock()
    sent: list[Sent] = []
    deadline = time.monotonic() + seconds

    def client() -> None:
        while time.monotonic() < deadline:
            with lock:
                number = next(counter)
                replay = number % 2 == 0 and bool(seeded)
                key = next(replays) if replay else f"{prefix}{number:05}"
            path = paths[number % len(paths)] if not replay else paths[0]
            started = time.monotonic()
            answer = post(server.url, path, _body(key), key, timeout=30)
            with lock:
                sent.append(Sent(key, path, started, time.monotonic(), answer))

    with ThreadPoolExecutor(CLIENTS + 1) as pool:
        clients = [pool.submit(client) for _ in range(CLIENTS)]
        pool.submit(during).result()
        for future in clients:
            future.result()
    return sent


@pytest.fixture(scope="module")
def cached_server(serve: Serve) -> Iterator[Server]:
    with serve("cache", IDEMPOTENCY_CACHE="idempotency", CONN_MAX_AGE="60") as running:
        yield running


@pytest.fixture(scope="module")
def persistent_server(serve: Serve) -> Iterator[Server]:
    """Persistent connections: after PostgreSQL comes back, each worker's old one is dead."""
    with serve("pg", CONN_MAX_AGE="60", IDEMPOTENCY_LEASE="10") as running:
        yield running


def test_redis_stopped_mid_run_fails_no_request_and_replays_continue_from_the_database(
    cached_server: Server,
    services: Services,
    db: Database,
    figures: Figures,
    timer: Callable[[], float],
) -> None:
    server, prefix = cached_server, "redis-"
    seeded = _seed(server, prefix, PATHS["atomic"])
    cache = redis.Redis.from_url(services.redis_url + "/3", socket_timeout=2)
    assert cache.dbsize() >= SEEDED  # The replays are being served from the cache tier.
    stopped: list[float] = []

    def stop_redis() -> None:
        time.sleep(2)
        services.stop_redis()
        stopped.append(time.monotonic())

    try:
        sent = _load(server, prefix, [PATHS["atomic"]], seeded, 6, stop_redis)
    finally:
        services.start_redis()

    after = [s for s in sent if s.sent_at > stopped[0]]
    failed = [s for s in sent if s.answer.status != 201]
    assert len(after) > CLIENTS  # Requests did run while Redis was down.
    assert not failed, [str(s.answer) for s in failed[:5]]
    for s in sent:
        if s.key in seeded:
            assert (s.answer.replayed, s.answer.body) == (True, seeded[s.key]), s.answer
        else:
            assert not s.answer.replayed, s.answer
    fresh = {s.key for s in sent if s.key not in seeded}
    executions = db.executions(prefix)
    assert {executions[key] for key in [*fresh, *seeded]} == {1}
    statuses = Counter(s.answer.status for s in sent)
    figures.add(
        Figure(
            "3. lost servers",
            "Redis (cache tier) stopped after 2 s of 6",
            requests=len(sent),
            absorbed=sum(s.answer.replayed for s in sent),
            executions="1",
            server_errors=sum(n for status, n in statuses.items() if status >= 500),
            seconds=timer(),
            notes=f"{len(after)} requests while Redis was down, "
            f"{sum(s.answer.replayed for s in after)} of them replays; failed: {len(failed)}",
        )
    )


def test_postgresql_stopped_mid_run_answers_503_and_no_key_runs_twice_after_it_returns(
    persistent_server: Server,
    services: Services,
    db: Database,
    figures: Figures,
    timer: Callable[[], float],
) -> None:
    server, prefix = persistent_server, "pg-"
    seeded = _seed(server, prefix, PATHS["atomic"])
    down: list[float] = []

    def outage() -> None:
        time.sleep(2)
        services.stop_postgres()
        down.append(time.monotonic())
        time.sleep(3)
        down.append(time.monotonic())
        services.start_postgres()

    try:
        sent = _load(server, prefix, list(PATHS.values()), seeded, 8, outage)
    finally:
        services.start_postgres()  # Already running unless the outage itself failed.

    statuses = Counter(s.answer.status for s in sent)
    assert set(statuses) <= {201, 503}, [
        f"{s.path}: {s.answer}" for s in sent if s.answer.status not in (201, 503)
    ][:3]
    for s in sent:
        if s.answer.status == 503:
            assert s.answer.problem()["type"].endswith("store-unavailable"), s.answer
            assert b"Traceback" not in s.answer.body
    while_down = [s for s in sent if down[0] < s.sent_at and s.received_at < down[1]]
    assert while_down and {s.answer.status for s in while_down} == {503}

    # After the outage, the client retries every key until it is answered.
    first: dict[str, Sent] = {}
    for s in sorted(sent, key=lambda s: s.sent_at):
        first.setdefault(s.key, s)
    retried: Counter[int] = Counter()
    for key, s in first.items():
        deadline = time.monotonic() + 30
        while True:
            answer = post(server.url, s.path, _body(key), key)
            retried[answer.status] += 1
            if answer.status not in (409, 503) or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # 409: a lease-mode claim cut off by the outage, until its lease ends.
        assert answer.status == 201, answer
        if key in seeded:
            assert (answer.replayed, answer.body) == (True, seeded[key])
        elif s.answer.status == 201:  # The client saw it run: the retry gets that response.
            assert (answer.replayed, answer.body) == (True, s.answer.body), (key, answer)
    executions = db.executions(prefix)
    assert {executions.get(key, 0) for key in first} == {1}, {
        key: n for key, n in executions.items() if n != 1
    }
    figures.add(
        Figure(
            "3. lost servers",
            "PostgreSQL stopped after 2 s for 3 s (atomic + lease)",
            requests=len(sent) + sum(retried.values()),
            absorbed=sum(s.answer.replayed for s in sent),
            executions="1",
            server_errors=statuses[503],
            seconds=timer(),
            notes=f"during the run: {dict(statuses)}, {len(while_down)} sent while down (all "
            f"503); retries of {len(first)} keys after restart: {dict(retried)}",
        )
    )
