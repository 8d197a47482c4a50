"""Scenario 8: exactly once end to end. The demo's payouts call a downstream bank (the demo again,
on a database of its own, guarded by this package) through a proxy that loses answers, while the
caller's workers are SIGKILLed at random points; every transfer is executed once at the bank."""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.client import Answer, post
from tests.reliability.harness import (
    Database,
    Figure,
    Figures,
    Serve,
    Server,
    Services,
    keep_artefact,
    manage,
)
from tests.reliability.proxy import DroppingProxy

# The bank keeps its transfers in a database of its own; the payouts' steps and records are in
# the run's database. The bank's atomic mode needs the database store.
pytestmark = pytest.mark.database_store

PAYOUTS = 40
CLIENTS = 8  # Payouts in flight at once, each retried by its client until it is answered.
DROP = 0.2  # The share of the bank's answers the proxy loses.
HOLD = 0.15  # Seconds the proxy may hold a request, and again its answer.
# Each point crashes a payout's worker with this probability (once per point and payout).
CRASH_POINTS = {"before-call": 0.1, "during-call": 0.1, "after-bank": 0.15, "after-step": 0.1}
LEASE = 4  # Seconds: a killed worker's payout is taken over this long after its claim.
KILL_EVERY = (2.0, 4.0)  # Seconds between the harness's own kills of a random caller worker.
GIVE_UP = 120  # Seconds a payout may take to be answered, crashes included.
PATH = "/api/payouts/"


@dataclass
class Payout:
    """One payout as its client saw it."""

    reference: str
    key: str
    amount: int
    answers: list[tuple[float, Answer]] = field(default_factory=list)

    @property
    def body(self) -> dict[str, Any]:
        return {"reference": self.reference, "amount": self.amount, "currency": "EUR"}

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


@pytest.fixture(scope="module")
def proxy(bank: tuple[Server, Database], seed: int) -> Iterator[DroppingProxy]:
    with DroppingProxy(bank[0].port, drop=DROP, seed=seed, hold=HOLD) as running:
        yield running


@pytest.fixture(scope="module")
def crash_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("crashes")


@pytest.fixture(scope="module")
def caller(serve: Serve, proxy: DroppingProxy, crash_dir: Path, seed: int) -> Iterator[Server]:
    """The payment service: the demo, calling the bank through the proxy, with crash points."""
    with serve(
        "caller",
        BANK_API_URL=f"{proxy.url}/bank",
        IDEMPOTENCY_LEASE=str(LEASE),
        DEMO_CRASH_POINTS=",".join(f"{point}:{p}" for point, p in CRASH_POINTS.items()),
        DEMO_CRASH_SEED=str(seed),
        DEMO_CRASH_DIR=str(crash_dir),
    ) as running:
        yield running


def pay(caller: Server, payout: Payout) -> None:
    """Send the payout until it has a final answer, with the same key every time."""
    deadline = time.monotonic() + GIVE_UP
    while time.monotonic() < deadline:
        answer = post(caller.url, PATH, payout.body, payout.key, timeout=30)
        payout.answers.append((time.time(), answer))
        if answer.status not in (0, 409, 503):
            return
        # 409: the claim of a killed worker, until its lease ends; 0: the worker died.
        time.sleep(0.25)


class Killer:
    """Kills a random worker of the server every few seconds (seeded), until stopped."""

    def __init__(self, server: Server, seed: int) -> None:
        self.server = server
        self.random = random.Random(seed)
        self.kills: list[float] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopped.wait(self.random.uniform(*KILL_EVERY)):
            workers = sorted(self.server.worker_pids())
            if workers:
                try:
                    os.kill(self.random.choice(workers), signal.SIGKILL)
                except ProcessLookupError:  # It died by a crash point meanwhile.
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


def test_every_payout_is_executed_once_at_the_bank(
    caller: Server,
    bank: tuple[Server, Database],
    proxy: DroppingProxy,
    crash_dir: Path,
    db: Database,
    figures: Figures,
    seed: int,
    timer: Callable[[], float],
) -> None:
    bank_server, bank_db = bank
    payouts = [
        Payout(f"payout-{number}", f"e2e-{seed}-{number}", 100 + number)
        for number in range(PAYOUTS)
    ]
    try:
        with Killer(caller, seed) as killer, ThreadPoolExecutor(CLIENTS) as clients:
            list(clients.map(lambda payout: pay(caller, payout), payouts))
    except BaseException:
        for server in (caller, bank_server):
            print(f"gunicorn's log kept at {keep_artefact(server.log)}")
        raise
    crashes = read_crashes(crash_dir)

    # Every payout was answered 201, and its answer is replayed to a further retry.
    for payout in payouts:
        assert payout.final.status == 201, (payout.reference, [str(a) for _, a in payout.answers])
        again = post(caller.url, PATH, payout.body, payout.key)
        assert (again.status, again.replayed, again.body) == (201, True, payout.final.body), again
    statuses = Counter(answer.status for payout in payouts for _, answer in payout.answers)
    assert not {status for status in statuses if status >= 500} - {503}, statuses

    # At the bank: one transfer per payout, under one key, the one the payout's answer names.
    transfers = bank_db.rows('SELECT id, reference, "key" FROM bank_transfer ORDER BY id')
    per_reference = Counter(reference for _, reference, _ in transfers)
    per_key = Counter(key for _, _, key in transfers)
    assert per_reference == {payout.reference: 1 for payout in payouts}, per_reference
    assert set(per_key.values()) == {1}, per_key
    by_reference = {reference: transfer for transfer, reference, _ in transfers}
    for payout in payouts:
        assert payout.final.json()["bank_transfer"] == by_reference[payout.reference]
    # And one settlement per payout at the caller.
    settlements = Counter(
        reference for (reference,) in db.rows("SELECT reference FROM payments_payout")
    )
    assert settlements == {payout.reference: 1 for payout in payouts}, settlements

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
    points = Counter(crash["point"] for crash in crashes)
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
                f"{PAYOUTS} payouts; {len(crashes) + len(killer.kills)} crashes "
                f"({', '.join(f'{n} {point}' for point, n in sorted(points.items()))}, "
                f"{len(killer.kills)} killed by the harness); {len(dropped)} answers dropped "
                f"({len(proxy.exchanges)} bank calls); 0 double executions, 0 missing; "
                f"{len(recoveries)} payouts hit, recovered in median "
                f"{statistics.median(recoveries):.1f} s, max {max(recoveries):.1f} s"
            ),
        )
    )
