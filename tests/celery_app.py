"""The Celery app of the task tests, and a bounded `celery beat` for them to run as a process.

Broker and results live in Redis database 1 (of `REDIS_URL`), and every test run gets a queue
of its own, so test runs side by side (tox envs) never take each other's tasks.

    python -m tests.celery_app QUEUE --every SECONDS --schedule-file PATH --lifetime SECONDS
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import uuid
from typing import Any
from urllib.parse import urlsplit

from celery import Celery

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:63799/0")
PURGE_ENTRY = "purge-expired-idempotency-records"
# The same entry as testproject's CELERY_BEAT_SCHEDULE (tests/test_tasks.py checks it is).
BEAT_SCHEDULE: dict[str, dict[str, Any]] = {
    PURGE_ENTRY: {"task": "django_idempotency.tasks.purge_expired_records", "schedule": 3600},
    "relay-idempotency-outbox": {"task": "django_idempotency.tasks.relay_outbox", "schedule": 5},
}


def redis_url(db: int = 1) -> str:
    """`REDIS_URL` pointed at another database, whether or not it names one."""
    return urlsplit(REDIS_URL)._replace(path=f"/{db}").geturl()


def new_queue() -> str:
    return f"django-idempotency-tests-{uuid.uuid4().hex[:12]}"


def make_app(
    queue: str, *, purge_every: float | None = None, visibility_timeout: float | None = None
) -> Celery:
    app = Celery("tests", set_as_current=False)
    schedule = {name: dict(entry) for name, entry in BEAT_SCHEDULE.items()}
    if purge_every is not None:
        schedule[PURGE_ENTRY]["schedule"] = purge_every
    app.conf.update(
        broker_url=redis_url(),
        result_backend=redis_url(),
        broker_connection_retry_on_startup=False,
        broker_connection_max_retries=1,
        task_default_queue=queue,
        result_expires=300,
        beat_schedule=schedule,
        beat_max_loop_interval=1,
    )
    if visibility_timeout is not None:
        # An unacknowledged message (acks_late, its worker killed) is delivered again this soon.
        app.conf.broker_transport_options = {
            "visibility_timeout": visibility_timeout,
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        }
    return app


def run_beat(argv: list[str]) -> None:
    """Run `celery beat` for the tests' app until `--lifetime` seconds are up, then stop."""
    parser = argparse.ArgumentParser(prog="python -m tests.celery_app")
    parser.add_argument("queue")
    parser.add_argument("--every", type=float, required=True)
    parser.add_argument("--schedule-file", required=True)
    parser.add_argument("--lifetime", type=int, required=True)
    options = parser.parse_args(argv)

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(0)  # Beat catches it, saves its schedule and returns.

    signal.signal(signal.SIGALRM, stop)
    signal.alarm(options.lifetime)  # Stops by itself even if the test that started it died.
    app = make_app(options.queue, purge_every=options.every)
    app.Beat(schedule=options.schedule_file, loglevel="INFO", max_interval=1).run()


if __name__ == "__main__":
    run_beat(sys.argv[1:])
