"""A Celery worker process for the idempotent task tests, on the test database it is given.

    DATABASE_URL=... python -m tests.celery_worker QUEUE --lifetime SECONDS

The tests kill it with SIGKILL mid-task; `--lifetime` stops it even if the test that started
it died first.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.celery_worker")
    parser.add_argument("queue")
    parser.add_argument("--lifetime", type=int, required=True)
    parser.add_argument("--visibility-timeout", type=float, default=2)
    options = parser.parse_args(argv)
    signal.alarm(options.lifetime)  # SIGALRM's default action ends the process.

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    import tests.tasks  # noqa: F401 - registers the tasks with every app.
    from tests.celery_app import make_app

    app = make_app(options.queue, visibility_timeout=options.visibility_timeout)
    app.worker_main(
        [
            "worker",
            "--pool=solo",
            "--loglevel=INFO",
            "--without-mingle",
            "--without-gossip",
            "--without-heartbeat",
            f"--queues={options.queue}",
        ]
    )


if __name__ == "__main__":
    main(sys.argv[1:])
