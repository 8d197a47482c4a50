"""The demo's downstream bank and its payouts: a transfer moves money once per key, a payout
whose answer from the bank was lost asks again with the same key, and the test-only crash points
kill a worker once per point and key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, override_settings

from django_idempotency import mint_key
from django_idempotency.models import OutboundCall
from django_idempotency.stores import database
from testproject.bank.models import Transfer
from testproject.payments.crashes import crash_point
from testproject.payments.models import Payout
from tests.reliability.proxy import DroppingProxy

ROOT = Path(__file__).resolve().parent.parent
TRANSFER = {"reference": "payout-1", "amount": 250, "currency": "EUR"}
# The identity the payout's operation is given (the proxy below is seeded for its transfer key).
OPERATION = "01K0PAY0VT0000000000000000"
# The key the outbound client derives for the transfer step of the payout keyed payout-key-1
# (namespace "payouts", anonymous): the payout's claim and operation, then the step, in the
# bank's namespace.
TRANSFER_KEY = mint_key(
    "payouts", "owner:", "payout-key-1", f"operation:{OPERATION}", "transfer", namespace="bank"
)

pytestmark = pytest.mark.urls("testproject.urls")


def transfer(client: Client, key: str, body: dict[str, Any] = TRANSFER) -> Any:
    return client.post(
        "/bank/transfers/",
        json.dumps(body),
        content_type="application/json",
        headers={"Idempotency-Key": key},
    )


@pytest.mark.django_db
def test_the_bank_moves_the_money_once_per_key(client: Client) -> None:
    first = transfer(client, "tr-1")
    again = transfer(client, "tr-1")
    other = transfer(client, "tr-2")

    assert (first.status_code, again.status_code, again["Idempotent-Replayed"]) == (
        201,
        201,
        "true",
    )
    assert again.content == first.content
    assert other.json()["id"] != first.json()["id"]
    rows = Transfer.objects.order_by("id").values_list("key", "reference", "amount")
    assert list(rows) == [("tr-1", "payout-1", 250), ("tr-2", "payout-1", 250)]


@pytest.mark.django_db
def test_the_bank_refuses_a_transfer_it_cannot_read_and_gives_the_key_back(
    client: Client,
) -> None:
    refused = transfer(client, "tr-1", {"reference": "payout-1"})
    corrected = transfer(client, "tr-1")

    assert refused.status_code == 400
    assert "amount" in refused.json()["detail"]
    assert corrected.status_code == 201
    assert Transfer.objects.count() == 1


@pytest.fixture
def losing_proxy(live_server: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[DroppingProxy]:
    """A proxy to the live bank that loses the answer to the payout's first transfer request
    and passes on the second (a seed found for the transfer's key, of the payout's operation:
    the one new operation minted meanwhile)."""
    monkeypatch.setattr(database, "new_operation_id", lambda: OPERATION)
    key = TRANSFER_KEY
    port = int(live_server.url.rsplit(":", 1)[1])
    proxy = DroppingProxy(port, drop=0.5, seed=0)
    proxy.seed = next(
        seed
        for seed in range(10_000)
        if DroppingProxy(port, drop=0.5, seed=seed).draw("drop", key, 0)
        < 0.5
        <= DroppingProxy(port, drop=0.5, seed=seed).draw("drop", key, 1)
    )
    with proxy, override_settings(BANK_API_URL=f"{proxy.url}/bank"):
        yield proxy


@pytest.mark.django_db(transaction=True)
def test_a_payout_whose_answer_was_lost_moves_the_money_once(
    client: Client, losing_proxy: DroppingProxy
) -> None:
    body = json.dumps({"reference": "payout-1", "amount": 250})
    headers = {"Idempotency-Key": "payout-key-1"}

    first = client.post("/api/payouts/", body, content_type="application/json", headers=headers)
    again = client.post("/api/payouts/", body, content_type="application/json", headers=headers)

    assert first.status_code == 201, first.content
    assert (again.status_code, again["Idempotent-Replayed"], again.content) == (
        201,
        "true",
        first.content,
    )
    assert [(e.attempt, e.status, e.dropped) for e in losing_proxy.exchanges] == [
        (0, 201, True),  # The bank moved the money; the payout never heard.
        (1, 201, False),  # Asked again with the same key: the bank's first answer, replayed.
    ]
    (moved,) = Transfer.objects.all()
    assert moved.key == TRANSFER_KEY
    (journaled,) = OutboundCall.objects.values_list("key", "step", "outcome", "attempts")
    assert journaled == (TRANSFER_KEY, "transfer", "confirmed", 2)
    assert first.json() == {
        "reference": "payout-1",
        "amount": 250,
        "currency": "EUR",
        "bank_transfer": moved.pk,
        "payout": Payout.objects.get(reference="payout-1").pk,
    }


CRASH = """
import django
django.setup()
from testproject.payments.crashes import crash_point
crash_point("before-call", "key-1")
crash_point("after-bank", "key-1")
print("survived")
"""


def run_crash_points(crash_dir: Path, points: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "DEMO_CRASH_POINTS": points,
        "DEMO_CRASH_SEED": "7",
        "DEMO_CRASH_DIR": str(crash_dir),
    }
    return subprocess.run(
        [sys.executable, "-c", CRASH], cwd=ROOT, env=env, capture_output=True, text=True
    )


def test_a_crash_point_kills_the_process_once_per_point_and_key(tmp_path: Path) -> None:
    killed = run_crash_points(tmp_path, "after-bank:1")
    retried = run_crash_points(tmp_path, "after-bank:1")
    never = run_crash_points(tmp_path / "never", "after-bank:0")

    assert (killed.returncode, killed.stdout) == (-9, "")
    assert (retried.returncode, retried.stdout) == (0, "survived\n")
    assert (never.returncode, never.stdout) == (0, "survived\n")
    log = (tmp_path / "crashes.jsonl").read_text().splitlines()
    assert [(json.loads(line)["point"], json.loads(line)["key"]) for line in log] == [
        ("after-bank", "key-1")
    ]


@pytest.mark.parametrize(
    ("points", "has_directory", "says"),
    [
        ("nowhere:1", True, "use before-call, during-call, after-bank, after-step"),
        ("after-bank:often", True, "needs a probability from 0 to 1"),
        ("after-bank:0.5", False, "without DEMO_CRASH_DIR"),
    ],
)
def test_crash_points_set_wrong_say_what_to_do(
    points: str, has_directory: bool, says: str, tmp_path: Path
) -> None:
    directory = str(tmp_path) if has_directory else ""
    with (
        override_settings(DEMO_CRASH_POINTS=points, DEMO_CRASH_DIR=directory),
        pytest.raises(ImproperlyConfigured, match=says),
    ):
        crash_point("after-bank", "key-1")


def test_crash_points_are_off_by_default() -> None:
    crash_point("after-bank", "key-1")  # Returns: the demo runs without them.
