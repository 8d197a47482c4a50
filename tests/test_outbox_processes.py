"""The outbox across real processes: a process lost right after its commit loses no message; a
relay killed at each of its crash points leaves every message sent once by the next relay, and
run once by a receiver guarded by this package; relays started together never send a message
twice; the relay command as a long-running worker; the relay publishing to a real Celery
worker on Redis, and the beat task relaying from inside that worker.

Each process is given the test's database (tests.clock_processes.environment) and stops by
itself (tests.outbox_processes' alarm); the tests kill what is left of them in `finally`.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.core.signals import request_started
from django.db import connections, transaction

import django_idempotency.tasks  # noqa: F401 - registers relay_outbox with every app.
from django_idempotency import crashes
from django_idempotency.models import IdempotencyRecord, OutboxMessage
from django_idempotency.outbound import IdempotentTransport, RetryPolicy
from django_idempotency.outbox import Relay, enqueue_request, enqueue_task, outbox_alias, relay_due
from django_idempotency.stores.database import clock_for
from tests import tasks
from tests.clock_processes import environment
from tests.downstream import Downstream, reset_downstream
from tests.models import Charge
from tests.utils import wait_for

ROOT = Path(__file__).resolve().parent.parent
GUARDED = "/downstream/guarded/"
# Longer than any child of these tests runs: communicate() never waits forever.
PROCESS_TIMEOUT = 60

pytestmark = [
    pytest.mark.urls("tests.downstream"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.database,  # Its processes are given DATABASE_URL.
]

State = OutboxMessage.State
RELAYED = re.compile(
    r"Relayed (\d+) message\(s\): (\d+) sent, (\d+) to retry, (\d+) dead, (\d+) taken over"
)


@pytest.fixture
def downstream() -> Iterator[Downstream]:
    yield from reset_downstream()


@pytest.fixture
def url(live_server: Any) -> Callable[[str], str]:
    return lambda path: f"{live_server.url}{path}"


@pytest.fixture
def arrivals() -> Iterator[list[tuple[str, str | None]]]:
    """(path, Idempotency-Key) of every request the live server received, as it arrived: the
    guarded view notes only the runs of its body, not the replays its guard answers."""
    seen: list[tuple[str, str | None]] = []
    lock = threading.Lock()

    def arrived(sender: Any, environ: dict[str, Any], **kwargs: Any) -> None:
        with lock:
            seen.append((environ.get("PATH_INFO", ""), environ.get("HTTP_IDEMPOTENCY_KEY")))

    request_started.connect(arrived, weak=False)
    yield seen
    request_started.disconnect(arrived)


def start(*args: str, crash_at: str = "") -> subprocess.Popen[str]:
    """A process of tests.outbox_processes on the test's database."""
    env = environment("database")
    env.pop("IDEMPOTENCY_CRASH_AT", None)
    if crash_at:
        env["IDEMPOTENCY_CRASH_AT"] = crash_at
    for alias in connections:  # SQLite: nothing of this process's may hold its file's lock.
        connections[alias].close()
    return subprocess.Popen(
        [sys.executable, "-m", "tests.outbox_processes", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    """Its exit status and output, once it ended (killed if it has not within the timeout)."""
    try:
        out, err = process.communicate(timeout=PROCESS_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"the process did not end within {PROCESS_TIMEOUT} s:\n{out}\n{err}")
    return process.returncode, out or "", err or ""


def reports(output: str) -> list[tuple[int, ...]]:
    """(handled, sent, retried, dead, lost) of each line the relay command printed."""
    return [tuple(map(int, found)) for found in RELAYED.findall(output)]


def leases_over() -> bool:
    """No message is held by a relay any more, by the database's clock (the relay's)."""
    now = clock_for(outbox_alias()).now()
    return not OutboxMessage.objects.filter(claimed_until__gt=now).exists()


def one_try_client() -> httpx.Client:
    return httpx.Client(transport=IdempotentTransport(policy=RetryPolicy(max_attempts=1)))


# 1. The process that wrote the message dies right after its commit.


def test_a_process_lost_right_after_its_commit_loses_the_outbox_message_but_not_on_commit_s(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    with_outbox = url(downstream.script("outbox-orders"))
    with_on_commit = url(downstream.script("on-commit-orders"))
    processes = [
        start("order", "outbox", "order-outbox", with_outbox),
        start("order", "on-commit", "order-on-commit", with_on_commit),
    ]
    try:
        ended = [finish(process) for process in processes]
    finally:
        for process in processes:
            process.kill()
            process.wait(PROCESS_TIMEOUT)

    # Both were killed (not ended), and only after their orders committed.
    for status, _, err in ended:
        assert status == -signal.SIGKILL, err
    assert set(Charge.objects.values_list("reference", flat=True)) == {
        "order-outbox",
        "order-on-commit",
    }
    # The outbox's order left its message behind; the other's send died with its process.
    message = OutboxMessage.objects.get()
    assert (message.state, message.destination) == (State.PENDING, with_outbox)
    assert downstream.keys("outbox-orders") == downstream.keys("on-commit-orders") == []

    report = relay_due(http_client=one_try_client())

    assert (report.sent, report.handled) == (1, 1)
    (seen,) = downstream.seen["outbox-orders"]
    assert (seen.method, seen.key, json.loads(seen.body)) == (
        "POST",
        message.key,
        {"order": "order-outbox"},
    )
    message.refresh_from_db()
    assert message.state == State.SENT
    # What transaction.on_commit was to send is gone for good: nothing anywhere holds it.
    assert downstream.keys("on-commit-orders") == []


# 2. A relay killed at each of its crash points; the next relay after its lease.

MESSAGES = 5


# How many messages (the first ones) a relay killed at each point had sent, and marked sent.
KILLED_AT = {"outbox.claimed": (0, 0), "outbox.sent": (1, 0), "outbox.marked": (1, 1)}


@pytest.mark.parametrize("point", list(KILLED_AT))
def test_a_relay_killed_at_any_point_leaves_each_message_run_once_by_the_next_relay(
    point: str,
    downstream: Downstream,
    url: Callable[[str], str],
    arrivals: list[tuple[str, str | None]],
) -> None:
    target = url(GUARDED)
    amounts: dict[str, int] = {}  # The Charge a message's run creates says which message ran.
    with transaction.atomic():
        for n in range(MESSAGES):
            amounts[enqueue_request("POST", target, json_body={"amount": 100 + n}).key] = 100 + n
    keys = list(OutboxMessage.objects.order_by("id").values_list("key", flat=True))
    sent, marked = KILLED_AT[point]

    def keys_arrived() -> list[str | None]:
        return [key for path, key in list(arrivals) if path == GUARDED]

    killed = start("relay", "--lease", "1", crash_at=point)
    try:
        status, out, err = finish(killed)
    finally:
        killed.kill()
        killed.wait(PROCESS_TIMEOUT)

    assert status == -signal.SIGKILL, f"the relay was not killed at {point}:\n{out}\n{err}"
    # What the dead relay left: every message claimed by it, sent and marked up to its point.
    assert keys_arrived() == keys[:sent]
    states = dict(OutboxMessage.objects.values_list("key", "state"))
    assert [key for key in keys if states[key] == State.SENT] == keys[:marked]
    held = OutboxMessage.objects.exclude(claim_token="").values_list("key", flat=True)
    assert sorted(held) == sorted(keys[marked:])

    wait_for(leases_over, 30)
    again = start("relay", "--lease", "1")
    try:
        status, out, err = finish(again)
    finally:
        again.kill()
        again.wait(PROCESS_TIMEOUT)

    assert status == 0, err
    remaining = MESSAGES - marked
    assert reports(out) == [(remaining, remaining, 0, 0, 0)]
    assert set(OutboxMessage.objects.values_list("state", flat=True)) == {State.SENT}
    # The receiver saw the message sent but not marked twice, under the same key...
    assert Counter(keys_arrived()) == Counter(keys) + Counter(keys[marked:sent])
    # ...and ran each message once: one run of the guarded view, one Charge, per message.
    assert Counter(downstream.keys("guarded")) == Counter(keys)
    assert Counter(Charge.objects.values_list("amount", flat=True)) == Counter(amounts.values())


# 3. Relays started together.


def test_relays_started_together_in_processes_never_send_one_message_twice(
    downstream: Downstream, url: Callable[[str], str], tmp_path: Path
) -> None:
    target = url(downstream.script("fanout"))
    with transaction.atomic():
        keys = [enqueue_request("POST", target, json_body={"n": n}).key for n in range(60)]
    go = tmp_path / "go"
    relays = [
        start("relay", "--ready", str(tmp_path / f"ready-{n}"), "--go", str(go), "--batch-size=5")
        for n in range(3)
    ]
    try:
        wait_for(lambda: all((tmp_path / f"ready-{n}").exists() for n in range(3)), 60)
        go.touch()  # All three claim from the same outbox from now on.
        ended = [finish(relay) for relay in relays]
    finally:
        for relay in relays:
            relay.kill()
            relay.wait(PROCESS_TIMEOUT)

    for status, _, err in ended:
        assert status == 0, err
    said = [report for _, out, _ in ended for report in reports(out)]
    assert sum(sent for _, sent, _, _, _ in said) == 60
    assert not any(retried or dead or lost for _, _, retried, dead, lost in said)
    # Each message arrived exactly once: never sent by two relays, none left behind.
    arrived = Counter(downstream.keys("fanout"))
    assert arrived == Counter(keys)
    assert set(OutboxMessage.objects.values_list("state", "attempts")) == {(State.SENT, 1)}


# 4. The relay as a long-running worker.


def test_the_relay_loop_delivers_what_is_written_while_it_runs_and_stops_on_sigterm(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    target = url(downstream.script("loop"))
    before = enqueue_request("POST", target, json_body={"n": 1}).key
    looping = start("relay", "--loop", "--interval", "0.2")
    try:
        # Once the first is delivered, the loop runs: the second is written while it does.
        assert downstream.arrived("loop", 1, within=30) == [before]
        after = enqueue_request("POST", target, json_body={"n": 2}).key
        assert downstream.arrived("loop", 2, within=30) == [before, after]
        assert looping.poll() is None  # Still running, waiting for more.
        looping.send_signal(signal.SIGTERM)
        status, out, err = finish(looping)
    finally:
        looping.kill()
        looping.wait(PROCESS_TIMEOUT)

    assert status == 0, err
    assert reports(out) == [(1, 1, 0, 0, 0), (1, 1, 0, 0, 0)]
    assert set(OutboxMessage.objects.values_list("state", flat=True)) == {State.SENT}
    assert downstream.keys("loop") == [before, after]


def test_the_relay_loop_stopped_while_it_sends_finishes_that_message_first(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    message = enqueue_request("POST", url("/downstream/slow/"), json_body={"n": 1})
    looping = start("relay", "--loop", "--interval", "0.2")
    try:
        # The receiver holds the request until released: the relay is in the middle of it.
        assert downstream.arrived("slow", 1, within=30) == [message.key]
        looping.send_signal(signal.SIGTERM)
        # Whether the signal is handled before or after the answer comes, the outcome is one.
        threading.Timer(0.5, downstream.release.set).start()
        status, out, err = finish(looping)
    finally:
        downstream.release.set()
        looping.kill()
        looping.wait(PROCESS_TIMEOUT)

    assert status == 0, err
    assert reports(out) == [(1, 1, 0, 0, 0)]
    message.refresh_from_db()
    assert (message.state, message.attempts, message.claim_token) == (State.SENT, 1, "")
    assert downstream.keys("slow") == [message.key]


# 5. A real Celery worker on Redis.


@pytest.fixture
def finished() -> Iterator[list[tuple[str, str, Any]]]:
    """(task id, state, return value) of every task the worker ran."""
    from celery.signals import task_postrun  # type: ignore[import-untyped]

    seen: list[tuple[str, str, Any]] = []

    def ran(sender: Any, task_id: str, retval: Any, state: str, **kwargs: Any) -> None:
        seen.append((task_id, state, retval))

    task_postrun.connect(ran, weak=False)
    yield seen
    task_postrun.disconnect(ran)


@pytest.mark.usefixtures("worker")
@pytest.mark.celery
@pytest.mark.redis
@pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")
def test_a_task_published_twice_by_relays_runs_its_body_once_on_the_worker(
    celery_app: Any, finished: list[tuple[str, str, Any]]
) -> None:
    with transaction.atomic():
        message = enqueue_task(tasks.record_payment, args=["outbox-pay-1", 7])

    crashes.arm("outbox.sent", crashes.raise_crash)
    try:
        # Published to the broker; the relay fails before marking it sent.
        with pytest.raises(crashes.CrashPoint):
            Relay(app=celery_app, lease=timedelta(seconds=1)).run()
    finally:
        crashes.disarm()
    message.refresh_from_db()
    assert (message.state, message.claim_token != "") == (State.PENDING, True)

    wait_for(leases_over, 30)
    second = Relay(app=celery_app, lease=timedelta(seconds=1))
    try:
        report = second.run()
    finally:
        second.close()

    assert (report.sent, report.handled) == (1, 1)
    message.refresh_from_db()
    assert message.state == State.SENT
    wait_for(lambda: len(finished) >= 2, 30)
    charge = Charge.objects.get(reference="outbox-pay-1")  # The body ran once.
    result = {"charge": charge.pk, "reference": "outbox-pay-1"}
    # Both deliveries reached the worker under the message's key; the second got the first's
    # result back.
    assert finished == [(message.key, "SUCCESS", result)] * 2
    assert IdempotencyRecord.objects.get().key == message.key


@pytest.mark.usefixtures("worker")
@pytest.mark.celery
@pytest.mark.redis
@pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")
def test_the_beat_task_run_by_the_worker_relays_a_request_and_a_task(
    celery_app: Any,
    downstream: Downstream,
    url: Callable[[str], str],
    finished: list[tuple[str, str, Any]],
) -> None:
    target = url(downstream.script("beat"))
    with transaction.atomic():
        request = enqueue_request("POST", target, json_body={"n": 1})
        task = enqueue_task(tasks.record_payment, args=["outbox-beat-1", 3])

    result = celery_app.send_task("django_idempotency.tasks.relay_outbox")

    assert result.get(timeout=30) == {"sent": 2, "retried": 0, "dead": 0, "lost": 0}
    assert downstream.keys("beat") == [request.key]
    assert set(OutboxMessage.objects.values_list("state", flat=True)) == {State.SENT}
    # The task call went out through the worker's own app, to this worker, which ran it.
    wait_for(lambda: any(task_id == task.key for task_id, _, _ in list(finished)), 30)
    assert Charge.objects.filter(reference="outbox-beat-1").count() == 1
