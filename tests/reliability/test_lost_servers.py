"""Scenario 3: Redis, then the database (PostgreSQL or MariaDB), stopped in the middle of a run of
requests; the database restarted under persistent connections.

On the database store (RELIABILITY_STORE=database): Redis is the cache tier's, and the database
is the store. On the Redis store (RELIABILITY_STORE=redis): Redis is the store, killed and started
again from its append-only file; the database's scenarios are the database store's alone."""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from urllib.parse import urlencode

import pytest
import redis

from django_idempotency.core.keys import key_hash
from tests.reliability.client import Answer, paced, post
from tests.reliability.harness import (
    Database,
    Figure,
    Figures,
    Records,
    Serve,
    Server,
    Services,
    wait_until,
)
from tests.reliability.test_isolation import session_login

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
    seconds: float | None,
    during: Callable[[], None],
) -> list[Sent]:
    """CLIENTS threads send fresh keys and replays, paced, for `seconds` (None: until `during`
    returns); `during` runs meanwhile."""
    counter = itertools.count()
    replays = itertools.cycle(sorted(seeded))
    lock = threading.Lock()
    sent: list[Sent] = []
    deadline = time.monotonic() + seconds if seconds is not None else float("inf")
    finished = threading.Event()

    def client() -> None:
        pace = paced()
        while time.monotonic() < deadline and not (seconds is None and finished.is_set()):
            pace()
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
        try:
            pool.submit(during).result()
        finally:
            finished.set()
        for future in clients:
            future.result()
    return sent


@pytest.fixture(scope="module")
def cached_server(serve: Serve) -> Iterator[Server]:
    with serve("cache", IDEMPOTENCY_CACHE="idempotency", CONN_MAX_AGE="60") as running:
        yield running


@pytest.fixture(scope="module")
def persistent_server(serve: Serve) -> Iterator[Server]:
    """Persistent connections: after the database comes back, each worker's old one is dead."""
    with serve("database", CONN_MAX_AGE="60", IDEMPOTENCY_LEASE="10") as running:
        yield running


@pytest.mark.database_store
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
    # The replays are being served from the cache tier. The copy of a response is written as
    # the response is closed, after its last byte reached the client: wait for the last one.
    wait_until(lambda: cache.dbsize() >= SEEDED, 10, "the seeded responses in the cache tier")
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


@pytest.mark.database_store
def test_the_database_stopped_mid_run_answers_503_and_no_key_runs_twice_after_it_returns(
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
        services.stop_database()
        down.append(time.monotonic())
        time.sleep(3)
        down.append(time.monotonic())
        services.start_database()

    try:
        sent = _load(server, prefix, list(PATHS.values()), seeded, 8, outage)
    finally:
        services.start_database()  # Already running unless the outage itself failed.

    statuses, while_down = _answered_through_the_outage(sent, down)

    first, retried = _retry_every_key(server, sent, seeded, patience=30)
    executions = db.executions(prefix)
    assert {executions.get(key, 0) for key in first} == {1}, {
        key: n for key, n in executions.items() if n != 1
    }
    figures.add(
        Figure(
            "3. lost servers",
            f"{services.label} stopped after 2 s for 3 s (atomic + lease)",
            requests=len(sent) + sum(retried.values()),
            absorbed=sum(s.answer.replayed for s in sent),
            executions="1",
            server_errors=statuses[503],
            seconds=timer(),
            notes=f"during the run: {dict(statuses)}, {len(while_down)} sent while down (all "
            f"503); retries of {len(first)} keys after restart: {dict(retried)}",
        )
    )


# The Redis store's Redis killed mid-run. Its lease outlasts the outage: a response that could not
# be stored while Redis was down is stored once it is back (the completion is retried until the
# lease ends), and a claim cut off by the outage ends with its lease. The outage lasts until the
# probe sent while Redis is down is answered, which on a loaded machine waits for a worker thread
# retrying its completion: 10 s of lease were once shorter than that outage, and a completion
# given up on let the retry run its view again, as the docs say of an outage longer than a lease.
REDIS_STORE_LEASE = 30
OUTAGE = 3  # Seconds Redis is down, from 2 s into the run, which goes on 3 s after it is back.


@pytest.fixture(scope="module")
def redis_store_server(serve: Serve) -> Iterator[Server]:
    """The demo on the Redis store (lease mode; `serve` sets both from RELIABILITY_STORE)."""
    with serve("redis-store", IDEMPOTENCY_LEASE=str(REDIS_STORE_LEASE)) as running:
        yield running


@pytest.mark.redis_store
def test_the_redis_store_killed_mid_run_answers_503_and_no_key_runs_twice_after_it_returns(
    redis_store_server: Server,
    services: Services,
    db: Database,
    store: Records,
    figures: Figures,
    timer: Callable[[], float],
) -> None:
    server, prefix = redis_store_server, "redis-store-"
    seeded = _seed(server, prefix, PATHS["atomic"])
    # The records are in Redis, none in the database: the demo runs on the Redis store.
    assert {r[0] for r in store.records("payments", prefix).values()} == {"completed"}
    assert len(store.records("payments", prefix)) == SEEDED
    assert not db.records("payments", prefix)
    down: list[float] = []
    probes: list[Sent] = []

    def outage() -> None:
        time.sleep(2)
        services.kill_redis()  # SIGKILL: what was acknowledged is in the append-only file.
        down.append(time.monotonic())
        # A request sent and answered while Redis is down, whatever the clients are doing: on a
        # loaded machine every client may be in a view that keeps trying to store its result
        # until Redis is back (lease mode), and so be answered only after it.
        key, started = f"{prefix}probe", time.monotonic()
        answer = post(server.url, PATHS["lease"], _body(key), key, timeout=30)
        probes.append(Sent(key, PATHS["lease"], started, time.monotonic(), answer))
        time.sleep(max(0.0, OUTAGE - (time.monotonic() - down[0])))
        down.append(time.monotonic())
        services.start_redis()  # From the append-only file.
        down.append(time.monotonic())  # It answers again.
        time.sleep(3)

    try:
        sent = _load(server, prefix, list(PATHS.values()), seeded, None, outage) + probes
    finally:
        services.start_redis()  # Already running unless the outage itself failed.
    # What was stored before the crash survived it.
    survived = store.records("payments", f"{prefix}seed-")
    assert {key for _, key in survived} == set(seeded), len(survived)

    statuses, while_down = _answered_through_the_outage(sent, down)
    for s in sent:
        if s.answer.status != 503 and s.key in seeded:
            assert (s.answer.replayed, s.answer.body) == (True, seeded[s.key]), s.answer
    # Sent once Redis answered again: the 503s among them, and when the last was answered.
    back = [s for s in sent if s.sent_at > down[2]]
    late = [s.received_at - down[2] for s in back if s.answer.status == 503]

    first, retried = _retry_every_key(server, sent, seeded, patience=REDIS_STORE_LEASE + 20)
    executions = db.executions(prefix)
    twice = {key: n for key, n in executions.items() if n != 1}
    figures.add(
        Figure(
            "3. lost servers",
            f"Redis (the store) killed after 2 s for {OUTAGE} s, restarted from its AOF, 3 s more "
            "(/api/payments/ + /api/bench/lease/, both leased)",
            requests=len(sent) + sum(retried.values()),
            absorbed=sum(s.answer.replayed for s in sent),
            executions="1" if not twice and len(executions) == len(first) else str(twice),
            server_errors=statuses[503] + sum(n for status, n in retried.items() if status >= 500),
            seconds=timer(),
            notes=f"during the run: {dict(statuses)}, {len(while_down)} sent while down (all "
            f"503); restart from the AOF {down[2] - down[1]:.1f} s; sent after it: {len(back)}, "
            f"{len(late)} x 503 (the last answered {max(late, default=0):.1f} s after it); "
            f"retries of {len(first)} keys after restart: {dict(retried)}",
        )
    )
    assert {executions.get(key, 0) for key in first} == {1}, twice


# The database restarted under CONN_MAX_AGE: every worker thread holds a persistent connection that
# the restart kills; Django (CONN_HEALTH_CHECKS off) hands it to the thread's next request as is.
WORKER_THREADS = Server.workers * Server.threads
ROUNDS = 3
SLOW = 0.3  # Seconds the provider takes: requests sent at once then occupy every worker thread.


@dataclass(frozen=True)
class Endpoint:
    path: str
    form: bool = False  # The plain Django checkout form, rather than DRF's JSON.

    @property
    def success(self) -> int:
        return 303 if self.form else 201

    def send(self, server: Server, key: str, headers: list[tuple[str, str]]) -> Sent:
        if self.form:
            body: bytes | dict[str, object] = urlencode({**BODY, "description": key}).encode()
            headers = [("Content-Type", "application/x-www-form-urlencoded"), *headers]
        else:
            body = {**_body(key), "delay": SLOW}
        started = time.monotonic()
        answer = post(server.url, self.path, body, key, headers, timeout=10)
        return Sent(key, self.path, started, time.monotonic(), answer)


PROVIDER = (Endpoint("/api/provider/payments/"), Endpoint("/api/provider/lease/"))
CHECKOUT = Endpoint("/checkout/", form=True)


@dataclass(frozen=True)
class FirstQuery:
    """Who sends a request's first query, the one that meets the dead connection."""

    id: str
    label: str
    endpoints: tuple[Endpoint, ...]
    session: bool
    by_library: bool  # False: DRF and Django query first, before the package's guard is called.


FIRST_QUERIES = [
    FirstQuery("store", "the store (anonymous, atomic + lease)", PROVIDER, False, True),
    FirstQuery(
        "owner", "the guard's owner resolver (session user, Django view)", (CHECKOUT,), True, True
    ),
    FirstQuery(
        "drf-session",
        "DRF SessionAuthentication under IdempotencyMixin (session user)",
        PROVIDER,
        True,
        True,
    ),
]


def _at_once(requests: list[Callable[[], Sent]]) -> list[Sent]:
    """Send the requests together, one client thread each, released by one barrier."""
    barrier = threading.Barrier(len(requests))

    def run(request: Callable[[], Sent]) -> Sent:
        barrier.wait(timeout=30)
        return request()

    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(run, requests))


def _warm_up(
    server: Server, db: Database, case: FirstQuery, headers: list[tuple[str, str]], prefix: str
) -> dict[str, Sent]:
    """Fresh keys, then their replays, WORKER_THREADS at once, until every worker thread holds a
    persistent connection: a thread that never ran a query would open a new one after the
    restart and hide the failure. Returns each completed key's first answer."""
    # The slow provider views keep each thread busy, so the next request goes to another thread.
    endpoints = list(dict.fromkeys([*PROVIDER, *case.endpoints]))
    completed: dict[str, Sent] = {}
    deadline = time.monotonic() + 20
    for number in itertools.count():  # Ends by returning or by failing the test.
        batch = [
            (f"{prefix}warm-{number}-{i:02}", endpoints[i % len(endpoints)])
            for i in range(WORKER_THREADS)
        ]
        for _ in range(2):  # The first request, then its replay.
            answers = _at_once([partial(e.send, server, key, headers) for key, e in batch])
            for (key, endpoint), s in zip(batch, answers, strict=True):
                assert s.answer.status == endpoint.success, s.answer
                completed.setdefault(key, s)
        if db.client_connections() >= WORKER_THREADS:
            return completed
        assert time.monotonic() < deadline, (
            f"After 20 s of warm-up only {db.client_connections()} of {WORKER_THREADS} worker "
            "threads hold a connection."
        )
    raise AssertionError("itertools.count() ended")


def _burst(
    server: Server,
    case: FirstQuery,
    headers: list[tuple[str, str]],
    prefix: str,
    completed: dict[str, Sent],
) -> list[Sent]:
    """ROUNDS rounds of WORKER_THREADS requests at once (two thirds fresh keys, one third retries
    of keys completed before the restart), then the retry of each fresh key."""
    paths = {e.path: e for e in case.endpoints}
    earlier = itertools.cycle(sorted(k for k, s in completed.items() if s.path in paths))
    sent: list[Sent] = []
    for number in range(ROUNDS):
        batch: list[tuple[str, Endpoint]] = []
        for i in range(WORKER_THREADS):
            if i % 3 == 2:
                key = next(earlier)
                batch.append((key, paths[completed[key].path]))
            else:
                batch.append((f"{prefix}{number}-{i:02}", case.endpoints[i % len(case.endpoints)]))
        fresh = [(key, e) for key, e in batch if key not in completed]
        for requests in (batch, fresh):
            sent += _at_once([partial(e.send, server, key, headers) for key, e in requests])
    return sent


def _failure(answer: Answer) -> str:
    """What a failed request got: the problem's type, or the exception on DEBUG's 500 page."""
    if answer.status == 0:
        return answer.error.split(":")[0]
    if answer.is_problem:
        return f"{answer.status} {answer.problem()['type'].rsplit('#', 1)[-1]}"
    exception = re.search(rb"<title>(\w+)\s+at ", answer.body)
    name = exception.group(1).decode() if exception else "?"
    # Where it was raised: Django's session store (before the package) or elsewhere.
    where = " in the session store" if b"django/contrib/sessions/" in answer.body else ""
    return f"{answer.status} {name}{where}"


@pytest.mark.database_store
@pytest.mark.parametrize("case", FIRST_QUERIES, ids=lambda case: case.id)
def test_the_database_restarted_under_conn_max_age_fails_no_request_once_it_is_back(
    case: FirstQuery,
    persistent_server: Server,
    services: Services,
    db: Database,
    figures: Figures,
    timer: Callable[[], float],
) -> None:
    server, prefix = persistent_server, f"restart-{case.id}-"
    headers = session_login(server, "alice") if case.session else []
    completed = _warm_up(server, db, case, headers, prefix)
    warm_up_requests = 2 * len(completed)

    started_at = db.started_at()
    services.restart_database()
    # A stop that silently failed would leave the old server, and its connections, running.
    assert db.started_at() != started_at
    # Every persistent connection the workers hold is dead. The harness's own probe of the new
    # server may still be listed for a moment as it closes: the workers send nothing meanwhile,
    # so a connection of theirs that survived would stay listed.
    wait_until(lambda: db.client_connections() == 0, 5, "no client connection to the new server")

    sent = _burst(server, case, headers, prefix, completed)
    # One new connection per worker thread that served the burst, which shows it reached them
    # all (a thread whose only request failed has none: Django closed the dead one after it).
    reconnected = db.client_connections()
    endpoints = {e.path: e for e in case.endpoints}
    failed = [s for s in sent if s.answer.status == 0 or s.answer.status >= 500]
    others = [s for s in sent if s not in failed and s.answer.status != endpoints[s.path].success]
    assert not others, [f"{s.path}: {s.answer}" for s in others[:3]]

    # The client retries each key the burst left unanswered: it runs once, like every other.
    answers: dict[str, list[Answer]] = {}
    for s in sent:
        answers.setdefault(s.key, []).append(s.answer)
    retried = 0
    for key, got in answers.items():
        endpoint = endpoints[next(s.path for s in sent if s.key == key)]
        deadline = time.monotonic() + 10
        while all(a.status != endpoint.success for a in got) and time.monotonic() < deadline:
            retried += 1
            got.append(endpoint.send(server, key, headers).answer)
        succeeded = [a for a in got if a.status == endpoint.success]
        assert succeeded, (key, got[-1])
        first = completed[key].answer if key in completed else succeeded[0]
        if key not in completed:
            assert not first.replayed, (key, first)
        # Every later success replays the first response, before the restart or after it.
        for answer in succeeded:
            if answer is not first:
                assert (answer.replayed, answer.body) == (True, first.body), (key, answer)
    executions = db.executions(prefix)
    runs = {executions.get(key, 0) for key in [*completed, *answers]}

    failures = Counter(_failure(s.answer) for s in failed)
    figures.add(
        Figure(
            "3. lost servers",
            f"{services.label} restarted, CONN_MAX_AGE 60; first query: {case.label}",
            requests=len(sent) + retried,
            absorbed=sum(s.answer.replayed for s in sent),
            executions="1" if runs == {1} else str(sorted(runs)),
            server_errors=sum(s.answer.status >= 500 for s in failed),
            seconds=timer(),
            notes=f"after the restart {len(failed)} of {len(sent)} failed "
            f"({', '.join(f'{n} x {what}' for what, n in failures.items()) or 'none'}); "
            f"{reconnected} of {WORKER_THREADS} worker threads connected again; "
            f"warm-up {warm_up_requests} requests",
        )
    )
    assert runs == {1}, {key: n for key, n in executions.items() if n != 1}
    if case.by_library:
        # The promise: a dead persistent connection never fails a request once the database is
        # back (the first query is the package's own: the store's, or the owner resolver's).
        assert not failed, (
            f"{len(failed)} of {len(sent)} requests failed after the restart "
            f"({dict(failures)}), {reconnected} worker threads connected again; first: "
            f"{failed[0].path}: {failed[0].answer}"
        )
    else:
        # DRF authenticates (loading the session, then the user) before the package's guard is
        # called, so that query meets the dead connection in Django's session store and the
        # guard never sees it (Django's CONN_HEALTH_CHECKS spares it). Django closes the
        # connection after the failed request, so at most each thread's first request fails.
        assert len(failed) <= WORKER_THREADS, dict(failures)


def _answered_through_the_outage(
    sent: list[Sent], down: Sequence[float]
) -> tuple[Counter[int], list[Sent]]:
    """Every answer a 201 or a clean 503 store-unavailable, and only 503s while the server was
    down (`down`: when it stopped and when it was back): (statuses, those sent while down)."""
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
    return statuses, while_down


def _log_of(server: Server, key: str) -> list[str]:
    """The server's log lines about `key` (they name its hash), and its errors."""
    hashed = key_hash(key)
    lines = server.error_log().splitlines()
    return [line for line in lines if hashed in line or "ERROR" in line or "WARNING" in line]


def _retry_every_key(
    server: Server, sent: list[Sent], seeded: dict[str, bytes], *, patience: float
) -> tuple[dict[str, Sent], Counter[int]]:
    """After the outage, retry every key until it is answered, as a client would; each must end
    in its one stored response. Returns (first request per key, retries' statuses)."""
    first: dict[str, Sent] = {}
    for s in sorted(sent, key=lambda s: s.sent_at):
        first.setdefault(s.key, s)
    retried: Counter[int] = Counter()
    for key, s in first.items():
        deadline = time.monotonic() + patience
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
            assert (answer.replayed, answer.body) == (True, s.answer.body), (
                key,
                answer,
                _log_of(server, key),
            )
    return first, retried
