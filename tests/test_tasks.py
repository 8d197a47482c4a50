"""The purge Celery task on a real worker and a real Redis broker, scheduled by beat."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.signals import task_retry, task_success
from django.db import connection
from django.utils import timezone

from django_idempotency import tasks
from django_idempotency.exceptions import StoreUnavailable
from django_idempotency.models import IdempotencyRecord
from tests.celery_app import BEAT_SCHEDULE, PURGE_ENTRY
from tests.factories import IdempotencyRecordFactory
from tests.utils import lose_database

ROOT = Path(__file__).resolve().parent.parent
TASK = "django_idempotency.tasks.purge_expired_records"

# Celery's Redis result backend still calls a method redis-py 6+ deprecates.
pytestmark = pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")


@pytest.fixture
def records() -> dict[str, set[int]]:
    past = timezone.now() - timedelta(minutes=5)
    expired = IdempotencyRecordFactory.create_batch(3, expires_at=past)
    # Abandoned claims past their expiry (a crashed claim within its TTL stays for its retry).
    abandoned = IdempotencyRecordFactory.create_batch(
        2, in_progress=True, lease_expires_at=past, expires_at=past
    )
    other = IdempotencyRecordFactory.create_batch(2, expires_at=past, namespace="refunds")
    live = [IdempotencyRecordFactory(), IdempotencyRecordFactory(in_progress=True)]
    return {
        "expired": {r.pk for r in expired},
        "abandoned": {r.pk for r in abandoned},
        "other namespace": {r.pk for r in other},
        "live": {r.pk for r in live},
    }


def _remaining() -> set[int]:
    return set(IdempotencyRecord.objects.values_list("pk", flat=True))


def _counts(report: dict[str, Any]) -> dict[str, Any]:
    """The report without its duration, which only has to be a number of seconds."""
    counts = dict(report)
    seconds = counts.pop("seconds")
    assert isinstance(seconds, float) and seconds >= 0, report
    return counts


def test_the_task_has_its_public_name() -> None:
    assert tasks.purge_expired_records.name == TASK


@pytest.mark.django_db
def test_the_task_returns_the_report_as_json() -> None:
    IdempotencyRecordFactory.create_batch(2, expires_at=timezone.now() - timedelta(seconds=1))

    result = tasks.purge_expired_records.apply(kwargs={"batch_size": 1}).get()

    assert _counts(result) == {
        "expired": 2,
        "abandoned": 0,
        "total": 2,
        "batches": 2,
        "dry_run": False,
        "outbound_calls": 0,
        "outbox_messages": 0,
    }
    assert json.loads(json.dumps(result)) == result


@pytest.mark.usefixtures("database_down")
def test_a_lost_database_is_retried_with_a_growing_countdown_then_reported() -> None:
    countdowns: list[float] = []

    def collect(sender: Any, reason: Any, **kwargs: Any) -> None:
        if sender.name == TASK:
            countdowns.append(reason.when)

    task_retry.connect(collect, weak=False)
    try:
        # apply() runs each retry at once, in this process, instead of after its countdown.
        result = tasks.purge_expired_records.apply()
    finally:
        task_retry.disconnect(collect)

    assert countdowns == [60, 120, 240, 480, 900]  # Bounded: five retries, at most 15 minutes.
    assert result.state == "FAILURE"
    assert isinstance(result.result, StoreUnavailable)
    assert "Retry the purge when the database is back" in str(result.result)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("worker")
@pytest.mark.celery
@pytest.mark.redis
def test_a_purge_that_found_the_database_down_runs_again_once_it_is_back(
    celery_app: Celery, records: dict[str, set[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tasks, "RETRY_DELAY", 1)
    original = lose_database(connection)
    try:
        result = celery_app.send_task(TASK)
        deadline = time.monotonic() + 20
        while result.state != "RETRY" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert result.state == "RETRY", result.state
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(original)

    assert _counts(result.get(timeout=30))["total"] == 7
    assert _remaining() == records["live"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("worker")
@pytest.mark.celery
@pytest.mark.redis
def test_the_beat_entry_sent_by_name_purges_expired_records(
    celery_app: Celery, records: dict[str, set[int]]
) -> None:
    entry = celery_app.conf.beat_schedule[PURGE_ENTRY]

    result = celery_app.send_task(
        entry["task"], args=entry.get("args", ()), kwargs=entry.get("kwargs", {})
    )

    assert _counts(result.get(timeout=30)) == {
        "expired": 5,
        "abandoned": 2,
        "total": 7,
        "batches": 1,
        "dry_run": False,
        "outbound_calls": 0,
        "outbox_messages": 0,
    }
    assert _remaining() == records["live"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("worker")
@pytest.mark.celery
@pytest.mark.redis
def test_the_task_takes_a_batch_size_and_a_namespace(
    celery_app: Celery, records: dict[str, set[int]]
) -> None:
    result = celery_app.send_task(TASK, kwargs={"batch_size": 1, "namespace": "refunds"})

    assert _counts(result.get(timeout=30)) == {
        "expired": 2,
        "abandoned": 0,
        "total": 2,
        "batches": 2,
        "dry_run": False,
        "outbound_calls": 0,
        "outbox_messages": 0,
    }
    assert _remaining() == records["expired"] | records["abandoned"] | records["live"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("worker")
@pytest.mark.celery
@pytest.mark.redis
def test_celery_beat_runs_the_purge_on_schedule(
    celery_app: Celery, records: dict[str, set[int]], tmp_path: Path
) -> None:
    """A real `celery beat` process, ticking every second, sends the task to this worker."""
    reports: list[dict[str, Any]] = []

    def collect(sender: Any, result: dict[str, Any], **kwargs: Any) -> None:
        if sender.name == TASK:
            reports.append(result)

    task_success.connect(collect, weak=False)
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    # Beat only sends messages: it runs without Django, as it may in production.
    beat = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.celery_app",
            celery_app.conf.task_default_queue,
            "--every=1",
            f"--schedule-file={tmp_path / 'beat-schedule'}",
            "--lifetime=25",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not reports and beat.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        task_success.disconnect(collect)
        beat.terminate()
        output, _ = beat.communicate(timeout=10)

    assert reports, f"beat sent no purge the worker ran; beat said:\n{output}"
    assert _counts(reports[0]) == {
        "expired": 5,
        "abandoned": 2,
        "total": 7,
        "batches": 1,
        "dry_run": False,
        "outbound_calls": 0,
        "outbox_messages": 0,
    }
    assert f"Sending due task {PURGE_ENTRY} ({TASK})" in output
    assert _remaining() == records["live"]


def test_the_demo_schedules_the_same_beat_entry() -> None:
    """testproject's Celery app reads CELERY_* settings and finds the task by autodiscovery."""
    code = textwrap.dedent(
        """
        import json
        import sys
        import django
        django.setup()
        from testproject import celery_app as app
        app.loader.import_default_modules()
        print(json.dumps({
            "broker": app.conf.broker_url,
            "backend": app.conf.result_backend,
            "schedule": app.conf.beat_schedule,
            "registered": sys.argv[1] in app.tasks,
        }))
        """
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "REDIS_URL": "redis://redis.example:6380/4",
    }
    result = subprocess.run(
        [sys.executable, "-c", code, TASK], cwd=ROOT, env=env, capture_output=True, text=True
    )

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {
        "broker": "redis://redis.example:6380/4",
        "backend": "redis://redis.example:6380/4",
        "schedule": BEAT_SCHEDULE,
        "registered": True,
    }


WITHOUT_CELERY = """
import sys
sys.modules["celery"] = None  # Any `import celery...` now raises ImportError.
import django
django.setup()
import django_idempotency.tasks as tasks
import testproject
from django.core.management import call_command
call_command("check")
print(hasattr(tasks, "purge_expired_records"), hasattr(testproject, "celery_app"))
"""


def test_without_celery_the_tasks_module_imports_and_defines_no_task(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
    }
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_CELERY], cwd=ROOT, env=env, capture_output=True, text=True
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-2:] == ["False", "False"]
