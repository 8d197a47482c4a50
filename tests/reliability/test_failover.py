"""Scenario 7: the Redis store on a Redis Cluster whose primary is killed mid-run and replaced by
its replica, with IDEMPOTENCY_REDIS_WAIT_REPLICAS off and on; what waiting for a replica costs.

The cluster is this scenario's own (3 primaries, 3 replicas, a node timeout of 2 s), started by
scripts/services.sh; the database only counts the views' executions (payments per key)."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import statistics
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.reliability.client import Answer, paced, post
from tests.reliability.harness import (
    SERVICES_SH,
    Database,
    Figure,
    Figures,
    Serve,
    Server,
    ServiceError,
    Services,
    wait_until,
)

pytestmark = [pytest.mark.redis_store, pytest.mark.redis_cluster]

PATH = "/api/payments/"  # Leased on the Redis store.
BODY = {"amount": 250, "currency": "EUR"}
CLIENTS = 8
BEFORE, AFTER = 2.0, 2.0  # Seconds of load before the kill, and once the replica took over.
# Longer than a fail-over (the 2 s node timeout, then the election): a request whose result
# could not be stored while its primary was down keeps trying until it is back.
LEASE = 10
NODE_TIMEOUT_MS = 2000
COST_REQUESTS = 300


@dataclass(frozen=True)
class Sent:
    key: str
    sent_at: float
    received_at: float
    answer: Answer


class Cluster:
    """A Redis Cluster of this scenario's own, on six free ports (and their bus ports)."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.port = _free_ports()
        self.url = f"redis://127.0.0.1:{self.port}"
        self.directory = services.directory / "redis-cluster"

    def _services(self, script: str) -> None:
        environment = {
            **os.environ,
            "SERVICES_DIR": str(self.services.directory),
            "REDIS_CLUSTER_PORT": str(self.port),
            "REDIS_CLUSTER_NODE_TIMEOUT": str(NODE_TIMEOUT_MS),
        }
        result = subprocess.run(
            ["bash", "-c", f"source '{SERVICES_SH}'; {script}"],
            env=environment,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if result.returncode != 0:
            raise ServiceError(f"scripts/services.sh {script} failed: {result.stderr}")

    def start(self) -> None:
        self._services("start_redis_cluster")

    def stop(self) -> None:
        self._services("REDIS_CLUSTER_STARTED_HERE=1 stop_redis_cluster")

    def client(self) -> redis.RedisCluster:
        return redis.RedisCluster.from_url(self.url, socket_timeout=2)

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=1)

    def primary_of_slot_0(self) -> int:
        with self.node(self.port + 1) as any_node:
            [shard, *_] = sorted(any_node.execute_command("CLUSTER SLOTS"))
        return int(shard[2][1])

    def kill(self, port: int) -> None:
        """SIGKILL the node on `port`, as a crash would."""
        pid = int((self.directory / str(port) / "redis.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not Path(f"/proc/{pid}").exists(), 10, "the Redis node to die")
        (self.directory / str(port) / "redis.pid").unlink(missing_ok=True)

    def taken_over(self, port: int) -> bool:
        """Whether a node other than `port` now serves slot 0 and the cluster is whole again."""
        try:
            with self.node(self.port if port != self.port else self.port + 1) as other:
                state = other.execute_command("CLUSTER INFO")
                [shard, *_] = sorted(other.execute_command("CLUSTER SLOTS"))
        except redis.RedisError:
            return False
        return state.get("cluster_state") == "ok" and int(shard[2][1]) != port

    def rejoin(self, port: int) -> None:
        """Start the killed node again: it rejoins as the new primary's replica, in sync."""
        self._services(f"start_redis_cluster_node {port}")

        def replica_in_sync() -> bool:
            try:
                with self.node(port) as node:
                    info = node.info("replication")
            except redis.RedisError:
                return False
            return info.get("role") == "slave" and info.get("master_link_status") == "up"

        wait_until(replica_in_sync, 30, "the restarted node to be an up-to-date replica")

    def records(self, prefix: str) -> dict[str, str]:
        """key -> status of every record of the demo's keys starting with `prefix`."""
        client = self.client()
        found = {}
        try:
            for name in client.scan_iter(match=":1:django_idempotency:1:*", count=1000):
                fields = client.hmget(name, "key", "status")
                key, status = (value.decode() if value else "" for value in fields)
                if key.startswith(prefix):
                    found[key] = status
        finally:
            client.close()
        return found


def _free_ports() -> int:
    """A first port of six consecutive free ones whose bus ports (1000 above) are free too,
    above the range the kernel hands out to clients."""
    for first in range(61000, 61990, 10):
        ports = [p + bus for p in range(first, first + 6) for bus in (0, 1000)]
        try:
            for port in ports:
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first
    raise ServiceError("no six free ports between 61000 and 62000 for the Redis Cluster")


@pytest.fixture(scope="module")
def cluster(services: Services) -> Iterator[Cluster]:
    cluster = Cluster(services)
    try:
        cluster.start()
    except ServiceError as exc:
        cluster.stop()
        pytest.fail(str(exc), pytrace=False)
    yield cluster
    cluster.stop()


@contextlib.contextmanager
def _serving(
    serve: Serve, cluster: Cluster, name: str, replicas: int = 0, **settings: str
) -> Iterator[Server]:
    with serve(
        name,
        REDIS_CLUSTER_URL=cluster.url,
        IDEMPOTENCY_LEASE=str(LEASE),
        IDEMPOTENCY_REDIS_WAIT_REPLICAS=str(replicas),
        IDEMPOTENCY_REDIS_WAIT_TIMEOUT="0.5",
        **settings,
    ) as running:
        yield running


def _load(
    server: Server, prefix: str, during: Callable[[], None], replays: Sequence[str]
) -> list[Sent]:
    """CLIENTS threads send fresh keys, paced, and every other request a replay of one of
    `replays` if any, until `during` returns."""
    counter = itertools.count()
    cycle = itertools.cycle(replays or [""])
    lock = threading.Lock()
    sent: list[Sent] = []
    finished = threading.Event()

    def client() -> None:
        pace = paced()
        while not finished.is_set():
            pace()
            with lock:
                number = next(counter)
                key = next(cycle) if replays and number % 2 else f"{prefix}{number:05}"
            started = time.monotonic()
            answer = post(server.url, PATH, {**BODY, "description": key}, key, timeout=30)
            with lock:
                sent.append(Sent(key, started, time.monotonic(), answer))

    with ThreadPoolExecutor(CLIENTS + 1) as pool:
        clients = [pool.submit(client) for _ in range(CLIENTS)]
        try:
            pool.submit(during).result()
        finally:
            finished.set()
        for future in clients:
            future.result()
    return sent


def _in_series(server: Server, prefix: str) -> str:
    """COST_REQUESTS fresh keys one after another on the healthy cluster: their latency."""
    times = []
    for number in range(COST_REQUESTS):
        key = f"{prefix}series-{number:04}"
        started = time.perf_counter()
        answer = post(server.url, PATH, {**BODY, "description": key}, key)
        times.append(time.perf_counter() - started)
        assert answer.status == 201, answer
    median, p95 = statistics.median(times), statistics.quantiles(times, n=20)[-1]
    return f"median {median * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms"


def _retry(server: Server, key: str) -> Answer:
    """Retry as a client would until the key is answered (409: a claim still leased)."""
    deadline = time.monotonic() + LEASE + 20
    while True:
        answer = post(server.url, PATH, {**BODY, "description": key}, key)
        if answer.status not in (409, 503) or time.monotonic() > deadline:
            return answer
        time.sleep(0.2)


def _fail_over(
    server: Server, cluster: Cluster, prefix: str, replays: Sequence[str] = ()
) -> tuple[list[Sent], dict[str, Answer], dict[str, str], float]:
    """Load, SIGKILL the primary of slot 0, load until its replica took over, rejoin it, then
    retry every key: (sent, each key's retry, the records after the fail-over, its seconds)."""
    moments: list[float] = []

    def fail_over() -> None:
        time.sleep(BEFORE)
        victim = cluster.primary_of_slot_0()
        cluster.kill(victim)
        moments.append(time.monotonic())
        wait_until(lambda: cluster.taken_over(victim), 30, "a replica to take over")
        moments.append(time.monotonic())
        time.sleep(AFTER)
        cluster.rejoin(victim)  # A replica again, for the next run's WAIT.

    sent = _load(server, prefix, fail_over, replays)
    records = cluster.records(prefix)
    retried = {key: _retry(server, key) for key in sorted({s.key for s in sent})}
    return sent, retried, records, moments[1] - moments[0]


def _figure(
    figures: Figures,
    variant: str,
    sent: list[Sent],
    retried: dict[str, Answer],
    records: dict[str, str],
    executions: dict[str, int],
    took_over: float,
    seconds: float,
    cost: str,
) -> tuple[set[str], set[str]]:
    """Add the run's figure: (responses lost, keys run twice)."""
    statuses = Counter(s.answer.status for s in sent)
    # A response the client got (201, not a replay) whose record the fail-over lost.
    answered = {s.key for s in sent if s.answer.status == 201 and not s.answer.replayed}
    lost = {key for key in answered if records.get(key) != "completed"}
    twice = {key for key, count in executions.items() if count > 1}
    retries = Counter(answer.status for answer in retried.values())
    figures.add(
        Figure(
            "7. fail-over",
            variant,
            requests=len(sent) + len(retried),
            absorbed=sum(answer.replayed for answer in retried.values()),
            executions="1" if not twice else f"{len(twice)} keys twice",
            server_errors=statuses[503] + retries[503],
            seconds=seconds,
            notes=f"primary SIGKILLed after {BEFORE:.0f} s, replica took over in"
            f" {took_over:.1f} s; during the run: {dict(statuses)}; responses lost:"
            f" {len(lost)} of {len(answered)}; claims lost (run twice, response not lost):"
            f" {len(twice - lost)}; retries of {len(retried)} keys: {dict(retries)}; before the"
            f" kill, {COST_REQUESTS} fresh keys in series: {cost}",
        )
    )
    return lost, twice


@pytest.mark.parametrize("replicas", [0, 1], ids=["wait-replicas-off", "wait-replicas-1"])
def test_a_primary_killed_mid_run_is_replaced_and_every_key_retried(
    replicas: int,
    serve: Serve,
    cluster: Cluster,
    db: Database,
    figures: Figures,
    timer: Callable[[], float],
) -> None:
    prefix = f"failover-{replicas}-"
    with _serving(serve, cluster, f"failover-{replicas}", replicas) as server:
        cost = _in_series(server, prefix)
        sent, retried, records, took_over = _fail_over(server, cluster, prefix)
    executions = db.executions(prefix)
    variant = (
        "IDEMPOTENCY_REDIS_WAIT_REPLICAS = 1 (timeout 0.5 s)"
        if replicas
        else "IDEMPOTENCY_REDIS_WAIT_REPLICAS = 0 (the default)"
    )
    lost, twice = _figure(
        figures, variant, sent, retried, records, executions, took_over, timer(), cost
    )

    # Whatever the setting: every answer a 201 or a clean 503 (409: a claim re-run by a retry
    # of the cluster client, still leased), and every key answered once retried.
    assert {s.answer.status for s in sent} <= {201, 409, 503}, [
        str(s.answer) for s in sent if s.answer.status not in (201, 409, 503)
    ][:3]
    assert {answer.status for answer in retried.values()} == {201}, [
        (key, str(answer)) for key, answer in retried.items() if answer.status != 201
    ][:3]
    for s in sent:
        if s.answer.status == 201 and s.key not in lost:  # Its retry gets what it got.
            assert retried[s.key].body == s.answer.body, (s.key, str(retried[s.key]))
    if replicas:  # Waited for: nothing acknowledged is lost, nothing runs twice.
        assert (lost, twice) == (set(), set())


def test_the_cache_tier_on_the_cluster_loses_copies_in_a_fail_over_never_a_right_answer(
    serve: Serve, cluster: Cluster, db: Database, figures: Figures, timer: Callable[[], float]
) -> None:
    """The database store with its cache tier on the cluster: replays served from the cache
    before, through and after the fail-over are the stored responses; nothing runs twice."""
    prefix = "failover-cache-"
    with _serving(
        serve,
        cluster,
        "failover-cache",
        IDEMPOTENCY_STORE="django_idempotency.stores.database.DatabaseStore",
        IDEMPOTENCY_MODE="atomic",
        IDEMPOTENCY_CACHE="idempotency",
    ) as server:
        seeded = {}
        for number in range(50):
            key = f"{prefix}seed-{number:03}"
            answer = post(server.url, PATH, {**BODY, "description": key}, key)
            assert answer.status == 201, answer
            seeded[key] = answer.body
        sent, retried, _, took_over = _fail_over(server, cluster, prefix, sorted(seeded))
    executions = db.executions(prefix)
    statuses = Counter(s.answer.status for s in sent)
    figures.add(
        Figure(
            "7. fail-over",
            "the cache tier on the cluster (database store, atomic), replays and fresh keys",
            requests=len(sent) + len(retried),
            absorbed=sum(s.answer.replayed for s in sent),
            executions="1" if set(executions.values()) == {1} else str(executions),
            server_errors=sum(n for status, n in statuses.items() if status >= 500),
            seconds=timer(),
            notes=f"replica took over in {took_over:.1f} s; during the run: {dict(statuses)}",
        )
    )

    assert cluster.records(prefix) == {}  # Copies only: the records are in the database.
    # The database is the record: a cache that fails over answers from it, never wrongly.
    assert set(statuses) == {201}, [str(s.answer) for s in sent if s.answer.status != 201][:3]
    for s in sent:
        if s.key in seeded:
            assert (s.answer.replayed, s.answer.body) == (True, seeded[s.key]), str(s.answer)
    first = {s.key: s.answer.body for s in sorted(sent, key=lambda s: s.sent_at)[::-1]}
    for key, answer in retried.items():
        assert (answer.replayed, answer.body) == (True, seeded.get(key, first[key])), key
    assert set(executions.values()) == {1}
