"""The demo project starts, migrates, and its payments API replays retries."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

DEMO = """
import json
import django
django.setup()
from django.core.management import call_command
from django.test import Client
call_command("migrate", verbosity=0)
client = Client(SERVER_NAME="localhost")
headers = {"Idempotency-Key": "demo-1"}
body = json.dumps({"amount": 1000})
first = client.post("/api/payments/", body, content_type="application/json", headers=headers)
retry = client.post("/api/payments/", body, content_type="application/json", headers=headers)
missing = client.post("/api/payments/", body, content_type="application/json")
refund = json.dumps({"payment": json.loads(first.content)["id"], "amount": 10})
refunded = client.post("/api/refunds/", refund, content_type="application/json", headers=headers)
print(first.status_code, retry.status_code, retry["Idempotent-Replayed"], missing.status_code,
      refunded.status_code, first.content == retry.content)
"""


def _run(code: str, tmp_path: Path) -> str:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
    }
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_demo_passes_django_checks(tmp_path: Path) -> None:
    output = _run(
        "import django; django.setup(); from django.core.management import "
        "call_command; call_command('check')",
        tmp_path,
    )
    assert "no issues" in output


def test_the_demo_payments_api_runs_once_per_key(tmp_path: Path) -> None:
    assert _run(DEMO, tmp_path).split() == ["201", "201", "true", "400", "201", "True"]
