"""Scenario 8: exactly once end to end. The demo's payouts call a downstream bank (the demo again,
on a database of its own, guarded by this package) through a proxy that loses answers, while the
caller's workers (gunicorn's, or Celery's) are SIGKILLed at random points; every transfer is
executed once at the bank."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from testproject.payments.crashes import draw
from tests.reliability.client import Answer, post
from tests.reliability.harness import (
    LIFETIME,
    ROOT,
    Database,
    Figure,
    Figures,
    Serve,
    Server,
    Services,
    demo_environment,
    keep_artefact,
    manage,
    met_within,
    wait_until,
)
from tests.reliability.proxy import DroppingProxy

# The bank's atomic mode needs the database store.
pytestmark = pytest.mark.database_store

PAYOUTS = 40
CLIENTS = 8  # Payouts in flight at once, each retried by its client until it is answered.
DROP = 0.2  # The share of the bank's answers the proxy loses.
HOLD = 0.15  # Seconds the proxy may hold a request, and again its answer.
# Each point crashes a payout's worker with this probability (once per point and payout).
CRASH_POINTS = {"before-call": 0.1, "during-call": 0.1, "after-bank": 0.15, "after-step": 0.1}
# Seconds: a killed worker's payout is taken over this long after it last renewed its lease.
LEASE = 3
# Payouts whose work lasts longer than their lease (a wait between their steps), sent before the
# crashes begin, on keys no crash point fires on: their lease must be renewed, so that a
# duplicate sent after the lease's first end is still answered 409, not run.
SLOW = 4
SLOW_DELAY = 2.5 * LEASE
# Seconds between the harness's own kills of a random caller worker: gunicorn's, and Celery's
# (one that said it is ready; both are forked again from a loaded parent in milliseconds).
KILL_EVERY = (2.0, 4.0)
# Seconds a payout may take to be answered, crashes included: generous, as a redelivery waits
# VISIBILITY and a loaded machine is slow (a passing run is no slower).
GIVE_UP = 300
PATH = "/api/payouts/"
TASK = "testproject.payments.tasks.pay_out_later"
TASK_NAMESPACE = "payout-tasks"
CELERY_WORKERS = 3  # Worker processes (solo pool: one task at a time each).
VISIBILITY = 5  # Seconds before a message whose worker died is delivered again.
# Seconds after which the client sends a payout that has not completed again: a new message with
# the same reference, which the task's key makes a duplicate of the first (whichever arrives runs,
# once). The Redis broker's transport takes a message off its queue and records it as unacknowledged
# in a second round trip (celery/kombu#305): a worker killed between the two loses the message,
# which no visibility timeout brings back, and the harness's random kills hit that moment now and
# then. A project on that broker needs such a re-send (docs/celery.md), and so does this client.
RESEND_AFTER = 60
# Seconds the harness kills Celery workers for, at most: the chaos, then the recovery.
CHAOS = 120


@dataclass
class Payout:
    """One payout as its client saw it."""

    reference: str
    key: str
    amount: int
    answers: list[tuple[float, Answer]] = field(default_factory=list)

    delay: float = 0

    @property
    def body(self) -> dict[str, Any]:
        body = {"reference": self.reference, "amount": self.amount, "currency": "EUR"}
        return {**body, "delay": self.delay} if self.delay else body

    @property
    def final(self) -> Answer:
        return self.answers[-1][1]

    def first_crash(self) -> float | None:
        """When the client first lost its connection to a killed worker."""
        return next((at for at, answer in self.answers if answer.status == 0), None)


@pytest.fixture(scope="module")
def seed() -> int:
    run_seed = int(os.environ.get("RELIABILITY_SEED") or random.randrange(2**32))
    print(f"\nend to end: RELIABILITY_SEED={run_seed}")
    return run_seed


@pytest.fixture(scope="module")
def bank(services: Services, serve: Serve) -> Iterator[tuple[Server, Database]]:
    """The bank: the demo under gunicorn on a database of its own, answering POST /bank/..."""
    url = services.create_database("reliability_bank")
    manage(services, "migrate", "--verbosity", "0", DATABASE_URL=url)
    with serve("bank", DATABASE_URL=url) as running:
        yield running, Database(url)


@contextlib.contextmanager
def losing_proxy(bank: Server, seed: int) -> Iterator[DroppingProxy]:
    with DroppingProxy(bank.port, drop=DROP, seed=seed, hold=HOLD) as running:
        yield running


def caller_settings(proxy: DroppingProxy, crash_dir: Path, seed: int) -> dict[str, str]:
    """The payment service's: the bank through the proxy, the crash points, a short lease."""
    return {
        "BANK_API_URL": f"{proxy.url}/bank",
        "IDEMPOTENCY_LEASE": str(LEASE),
        "DEMO_CRASH_POINTS": ",".join(f"{point}:{p}" for point, p in CRASH_POINTS.items()),
        "DEMO_CRASH_SEED": str(seed),
        "DEMO_CRASH_DIR": str(crash_dir),
    }


class Killer:
    """Kills one of `workers()` at random every few seconds (seeded), until stopped."""

    def __init__(
        self, workers: Callable[[], list[int]], seed: int, every: tuple[float, float] = KILL_EVERY
    ) -> None:
        self.workers = workers
        self.every = every
        self.random = random.Random(seed)
        self.kills: list[float] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopped.wait(self.random.uniform(*self.every)):
            workers = sorted(self.workers())
            if workers:
                try:
                    os.kill(self.random.choice(workers), signal.SIGKILL)
                except ProcessLookupError:  # It died at a crash point meanwhile.
                    continue
                self.kills.append(time.time())

    def __enter__(self) -> Killer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)


def read_crashes(crash_dir: Path) -> list[dict[str, Any]]:
    log = crash_dir / "crashes.jsonl"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line]


@dataclass
class Agreement:
    """What the bank executed and what the caller's journal of outbound calls says of it."""

    transfers: dict[str, int]  # Each payout's transfer id at the bank, by reference.
    journal: Counter[str]  # The journal's rows of the transfers, by outcome.
    attempts: int  # Attempts the journal counted, over every run of every payout.


def check_the_bank(
    bank_db: Database, caller_db: Database, references: list[str], prefix: str, namespace: str
) -> Agreement:
    """One transfer per payout at the bank, each under a key of its own; one settlement per
    payout at the caller; and every transfer in the caller's journal (the operations of
    `namespace`) under its key, confirmed, or ambiguous with the row saying so."""
    transfers = bank_db.rows(
        'SELECT id, reference, "key" FROM bank_transfer WHERE reference LIKE %s ORDER BY id',
        prefix + "%",
    )
    per_reference = Counter(reference for _, reference, _ in transfers)
    per_key = Counter(key for _, _, key in transfers)
    assert per_reference == dict.fromkeys(references, 1), per_reference
    assert set(per_key.values()) == {1}, per_key
    settlements = Counter(
        reference
        for (reference,) in caller_db.rows(
            "SELECT reference FROM payments_payout WHERE reference LIKE %s", prefix + "%"
        )
    )
    assert settlements == dict.fromkeys(references, 1), settlements
    journal = {
        key: (step, outcome, attempts)
        for key, step, outcome, attempts in caller_db.rows(
            'SELECT "key", step, outcome, attempts FROM django_idempotency_outbound_call '
            "WHERE namespace = %s",
            namespace,
        )
    }
    unjournaled = [key for key in per_key if key not in journal]
    assert not unjournaled, f"transfers the caller's journal does not know: {unjournaled}"
    unexecuted = {key: row for key, row in journal.items() if key not in per_key}
    assert not unexecuted, f"journal rows of calls the bank never executed: {unexecuted}"
    outcomes = Counter(outcome for _, outcome, _ in journal.values())
    assert set(outcomes) <= {"confirmed", "ambiguous"}, outcomes
    assert {step for step, _, _ in journal.values()} == {"transfer"}, journal
    return Agreement(
        {reference: transfer for transfer, reference, _ in transfers},
        outcomes,
        sum(attempts for _, _, attempts in journal.values()),
    )


def journal_notes(agreement: Agreement) -> str:
    outcomes = ", ".join(f"{n} {outcome}" for outcome, n in sorted(agreement.journal.items()))
    return (
        f"journal: {outcomes} ({agreement.attempts} attempts), 0 transfers without a row, "
        "0 ambiguous without a row saying so"
    )


def check_steps_skipped(
    crashes: list[dict[str, Any]],
    references: dict[str, str],
    bank_db: Database,
    proxy: DroppingProxy,
) -> int:
    """A payout killed after its transfer step was stored never calls the bank again: its
    retry skips the step. `references`: each crash key's payout reference. Returns how many
    such crashes there were."""
    transfer_keys = dict(bank_db.rows('SELECT reference, "key" FROM bank_transfer'))
    after_step = [crash for crash in crashes if crash["point"] == "after-step"]
    for crash in after_step:
        key = transfer_keys[references[crash["key"]]]
        later = [e for e in proxy.exchanges if e.key == key and e.at > crash["at"]]
        assert not later, f"the bank was called again after the step was stored: {later}"
    return len(after_step)


def calm_keys(seed: int, count: int) -> list[str]:
    """Payout keys on which no crash point fires with this seed."""
    candidates = (f"e2e-{seed}-slow-{number}" for number in range(10_000))
    return [
        key
        for key in candidates
        if all(draw(str(seed), point, key) >= p for point, p in CRASH_POINTS.items())
    ][:count]


def crash_notes(crashes: list[dict[str, Any]], kills: list[float]) -> str:
    points = Counter(crash["point"] for crash in crashes)
    named = ", ".join(f"{n} {point}" for point, n in sorted(points.items()))
    return f"{len(crashes) + len(kills)} crashes ({named}, {len(kills)} killed by the harness)"


def recovery_notes(recoveries: list[float]) -> str:
    if not recoveries:
        return "no payout hit"
    return (
        f"{len(recoveries)} payouts hit, recovered in median {statistics.median(recoveries):.1f} "
        f"s, max {max(recoveries):.1f} s"
    )


def test_every_payout_is_executed_once_at_the_bank(
    serve: Serve,
    bank: tuple[Server, Database],
    db: Database,
    figures: Figures,
    seed: int,
    tmp_path: Path,
    timer: Callable[[], float],
) -> None:
    bank_server, bank_db = bank
    payouts = [
        Payout(f"payout-{number}", f"e2e-{seed}-{number}", 100 + number)
        for number in range(PAYOUTS)
    ]
    slow = [
        Payout(f"payout-slow-{number}", key, 900 + number, delay=SLOW_DELAY)
        for number, key in enumerate(calm_keys(seed, SLOW))
    ]
    duplicates: dict[str, Answer] = {}

    def pay(payout: Payout) -> None:
        """Send the payout until it has a final answer, with the same key every time."""
        deadline = time.monotonic() + GIVE_UP
        while time.monotonic() < deadline:
            answer = post(caller.url, PATH, payout.body, payout.key, timeout=30)
            payout.answers.append((time.time(), answer))
            if answer.status not in (0, 409, 503):
                return
            # 409: the claim of a killed worker, until its lease ends; 0: the worker died.
            time.sleep(0.25)

    def claimed(payout: Payout) -> bool:
        return bool(
            db.rows(
                'SELECT 1 FROM django_idempotency_record WHERE namespace = %s AND "key" = %s',
                "payouts",
                payout.key,
            )
        )

    def send_duplicate(payout: Payout) -> None:
        """Once the payout's first lease would have ended: counted from its claim, not from
        its request, which a loaded machine may serve seconds late (the duplicate then came
        first, and the payout itself was answered 409)."""
        wait_until(lambda: claimed(payout), 60, f"the claim of {payout.reference}")
        time.sleep(LEASE + 1.5)
        duplicates.setdefault(payout.reference, post(caller.url, PATH, payout.body, payout.key))

    def pay_slowly(payout: Payout) -> None:
        """Pay, and send a duplicate once the payout's first lease would have ended."""
        duplicate = threading.Thread(target=send_duplicate, args=(payout,))
        duplicate.start()
        pay(payout)
        duplicate.join()

    with (
        losing_proxy(bank_server, seed) as proxy,
        serve("caller", **caller_settings(proxy, tmp_path, seed)) as caller,
    ):
        try:
            with ThreadPoolExecutor(SLOW) as pool:  # Before the crashes: the lease renewed.
                list(pool.map(pay_slowly, slow))
            with Killer(caller.worker_pids, seed) as killer, ThreadPoolExecutor(CLIENTS) as pool:
                list(pool.map(pay, payouts))
        except BaseException:
            for server in (caller, bank_server):
                print(f"gunicorn's log kept at {keep_artefact(server.log)}")
            raise

        # Every payout was answered 201, and its answer is replayed to a further retry.
        for payout in payouts + slow:
            answers = [str(answer) for _, answer in payout.answers]
            assert payout.final.status == 201, (payout.reference, answers)
            again = post(caller.url, PATH, payout.body, payout.key)
            assert (again.status, again.replayed, again.body) == (201, True, payout.final.body)
    crashes = read_crashes(tmp_path)
    statuses = Counter(answer.status for payout in payouts for _, answer in payout.answers)
    assert not {status for status in statuses if status >= 500} - {503}, statuses

    # The slow payouts' leases were renewed: each ran once, its duplicate answered 409.
    for payout in slow:
        assert [answer.status for _, answer in payout.answers] == [201], payout.answers
        duplicate = duplicates[payout.reference]
        assert duplicate.status == 409, duplicate
        assert duplicate.problem()["type"].endswith("request-in-progress"), duplicate

    # At the bank: one transfer per payout, the one the payout's answer names.
    references = [payout.reference for payout in payouts + slow]
    agreement = check_the_bank(bank_db, db, references, "payout-", "payouts")
    for payout in payouts + slow:
        assert payout.final.json()["bank_transfer"] == agreement.transfers[payout.reference]
    skipped = check_steps_skipped(
        crashes, {payout.key: payout.reference for payout in payouts}, bank_db, proxy
    )

    # The run did what it says: workers died at the crash points and by the harness, and the
    # proxy lost answers of transfers the bank executed.
    dropped = proxy.dropped
    assert crashes, "no crash point fired: raise CRASH_POINTS"
    assert killer.kills, "the harness killed no worker"
    assert any(exchange.status == 201 for exchange in dropped), "no answer of the bank was lost"
    recoveries = [
        payout.answers[-1][0] - started
        for payout in payouts
        if (started := payout.first_crash()) is not None
    ]
    figures.add(
        Figure(
            "8. end to end",
            f"HTTP caller (lease {LEASE} s), bank through a proxy losing {DROP:.0%} of answers",
            requests=sum(len(payout.answers) for payout in payouts),
            absorbed=statuses[409],
            executions="1",
            server_errors=sum(count for status, count in statuses.items() if status >= 500),
            seconds=timer(),
            notes=(
                f"{PAYOUTS} payouts; {crash_notes(crashes, killer.kills)}; "
                f"{len(dropped)} answers dropped ({len(proxy.exchanges)} bank calls); "
                f"0 double executions, 0 missing; {journal_notes(agreement)}; "
                f"{skipped} killed after the transfer step: 0 bank calls again; "
                f"{SLOW} payouts of {SLOW_DELAY:.1f} s under a {LEASE} s lease renewed, each "
                f"run once, their duplicates 409; {recovery_notes(recoveries)}"
            ),
        )
    )


class CeleryWorkers:
    """`count` Celery workers of the demo (solo pool), each started again when it dies: forked
    from one process that has loaded the demo (tests/reliability/celery_forks.py), as gunicorn's
    workers are, so that a start costs milliseconds, not an import of Django and Celery."""

    def __init__(self, count: int, environment: dict[str, str], log: Path) -> None:
        self.count = count
        self.environment = environment
        self.log = log
        self.forks: subprocess.Popen[str] | None = None
        self.pids: list[int] = []
        self.started = 0
        self.names: dict[int, str] = {}  # pid: the node name it was started with
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._supervise, daemon=True)
        self.lock = threading.Lock()

    def _start_one(self) -> int:
        assert self.forks is not None and self.forks.stdin and self.forks.stdout
        name = f"e2e-{self.started}@"
        self.started += 1
        self.forks.stdin.write(name + "\n")
        self.forks.stdin.flush()
        answer = self.forks.stdout.readline()
        if not answer:
            raise RuntimeError(f"the Celery workers' parent exited: see {self.log}")
        pid = int(answer)
        self.names[pid] = name
        return pid

    def _supervise(self) -> None:
        while not self.stopped.wait(0.2):
            with self.lock:
                self.pids = [pid if _alive(pid) else self._start_one() for pid in self.pids]

    def ready_pids(self) -> list[int]:
        """The workers that have said they are ready (Celery logs "<name> ready."): one still
        starting holds no task, so killing it would test nothing and only cost another start."""
        said = self.log.read_text(errors="replace") if self.log.exists() else ""
        with self.lock:
            return [
                pid
                for pid in self.pids
                if _alive(pid) and re.search(re.escape(self.names[pid]) + r"\S* ready\.", said)
            ]

    def __enter__(self) -> CeleryWorkers:
        command = [
            sys.executable, "-m", "tests.reliability.celery_forks", str(LIFETIME), "--",
            "-A", "testproject", "worker", "--pool=solo",
            "--without-mingle", "--without-gossip", "--without-heartbeat",
            "--loglevel=INFO", "--concurrency=1", "--prefetch-multiplier=1",
        ]  # fmt: skip
        with self.log.open("ab") as log:
            self.forks = subprocess.Popen(
                command,
                cwd=ROOT,
                env=self.environment,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
            )
        with self.lock:
            self.pids = [self._start_one() for _ in range(self.count)]
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        assert self.forks is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.forks.pid, signal.SIGKILL)
        self.forks.wait(timeout=10)


def _alive(pid: int) -> bool:
    """Whether a worker still runs (the forks' parent reaps the dead at once)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_every_payout_task_is_executed_once_at_the_bank(
    services: Services,
    bank: tuple[Server, Database],
    db: Database,
    figures: Figures,
    seed: int,
    tmp_path: Path,
    timer: Callable[[], float],
) -> None:
    bank_server, bank_db = bank
    references = [f"task-payout-{number}" for number in range(PAYOUTS)]
    app = Celery("e2e", broker=f"{services.redis_url}/0", set_as_current=False)
    completed_at: dict[str, float] = {}
    sent_at: dict[str, float] = {}
    resent: list[str] = []

    def send(number: int, reference: str) -> None:
        app.send_task(TASK, kwargs={"reference": reference, "amount": 100 + number})
        sent_at[reference] = time.monotonic()

    def completed_or_resent() -> bool:
        """Whether every payout completed; those overdue are sent again meanwhile."""
        rows = db.rows(
            'SELECT "key" FROM django_idempotency_record '
            "WHERE namespace = %s AND status = 'completed'",
            TASK_NAMESPACE,
        )
        now = time.time()
        for (reference,) in rows:
            completed_at.setdefault(reference, now)
        for number, reference in enumerate(references):
            if (
                reference not in completed_at
                and time.monotonic() > sent_at[reference] + RESEND_AFTER
            ):
                send(number, reference)
                resent.append(reference)
        return len(completed_at) == PAYOUTS

    with losing_proxy(bank_server, seed) as proxy:
        environment = demo_environment(
            services,
            **caller_settings(proxy, tmp_path, seed),
            CELERY_VISIBILITY_TIMEOUT=str(VISIBILITY),
        )
        log = tmp_path / "celery.log"
        try:
            with CeleryWorkers(CELERY_WORKERS, environment, log) as workers:
                for number, reference in enumerate(references):
                    send(number, reference)
                with Killer(workers.ready_pids, seed) as killer:
                    met_within(completed_or_resent, CHAOS)
                # The harness stops killing; the crash points still fire. On a loaded machine a
                # worker's start can take longer than the kills leave it: tasks must then all
                # complete once the kills stop, whatever the kills left behind.
                wait_until(completed_or_resent, GIVE_UP, "every payout task to complete")
        except BaseException:
            print(f"the Celery workers' log kept at {keep_artefact(log)}")
            raise
        finally:
            app.close()
    crashes = read_crashes(tmp_path)

    agreement = check_the_bank(bank_db, db, references, "task-payout-", TASK_NAMESPACE)
    skipped = check_steps_skipped(
        crashes, {reference: reference for reference in references}, bank_db, proxy
    )
    dropped = proxy.dropped
    assert crashes, "no crash point fired: raise CRASH_POINTS"
    assert killer.kills, "the harness killed no worker"
    assert any(exchange.status == 201 for exchange in dropped), "no answer of the bank was lost"
    # Recovery: from a crash point's kill to its payout's completion (the harness's kills hit
    # whatever task the worker ran, which the suite does not know).
    recoveries = [completed_at[crash["key"]] - crash["at"] for crash in crashes]
    figures.add(
        Figure(
            "8. end to end",
            f"Celery caller (acks_late, lease {LEASE} s, redelivered after {VISIBILITY} s), "
            f"bank through a proxy losing {DROP:.0%} of answers",
            requests=PAYOUTS,
            executions="1",
            seconds=timer(),
            notes=(
                f"{PAYOUTS} payout tasks, {CELERY_WORKERS} workers started "
                f"{workers.started} times; {crash_notes(crashes, killer.kills)}; "
                f"{len(dropped)} answers dropped ({len(proxy.exchanges)} bank calls); "
                f"0 double executions, 0 missing; {journal_notes(agreement)}; "
                f"{skipped} killed after the transfer step: 0 bank calls again; "
                f"{recovery_notes(recoveries)}; re-sent after {RESEND_AFTER} s: {len(resent)}"
            ),
        )
    )
