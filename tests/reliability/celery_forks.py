"""Celery workers of the demo forked from one process that has loaded Django and Celery once.

The end-to-end scenario kills its Celery workers every few seconds. A worker started afresh
imports Django, the demo and Celery again: seconds of CPU on a loaded machine, each time. This
process imports them once, opens no connection, and forks a worker for each node name it reads
on stdin, answering with the worker's pid. Each worker is the leader of a session of its own (the
suite kills its group) and stops by itself after `lifetime` seconds, as this process does.

    python -m tests.reliability.celery_forks LIFETIME -- WORKER ARGUMENTS...
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable


def main() -> None:
    lifetime = int(sys.argv[1])
    worker_arguments = sys.argv[sys.argv.index("--") + 1 :]
    signal.alarm(lifetime)
    import django

    django.setup()
    # What a worker would import as it starts: Celery's command line and worker, the broker's
    # transport, and the demo's app with its tasks.
    import celery.apps.worker
    import celery.worker.consumer  # noqa: F401
    import kombu.transport.redis  # noqa: F401
    from celery.__main__ import main as celery_main
    from django.db import connections

    from testproject.celery import app

    app.loader.import_default_modules()
    connections.close_all()  # A forked worker must not share a connection with its siblings.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # Dead workers are reaped by the kernel.
    for line in sys.stdin:
        pid = os.fork()
        if pid == 0:
            _become_worker(line.strip(), worker_arguments, lifetime, celery_main)
        print(pid, flush=True)


def _become_worker(
    name: str, arguments: list[str], lifetime: int, celery_main: Callable[[], object]
) -> None:
    os.setsid()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.alarm(lifetime)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # Its log, like the process's stderr.
    sys.argv = ["celery", *arguments, f"--hostname={name}%h"]
    try:
        code = celery_main()
    except SystemExit as stopped:
        code = stopped.code
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)


if __name__ == "__main__":
    main()
