"""Processes for the outbox's process tests (tests/test_outbox_processes.py): one placing an
order and lost the moment its transaction commits, and the relay command.

    python -m tests.outbox_processes order outbox|on-commit REFERENCE URL
    python -m tests.outbox_processes relay [--ready PATH --go PATH] [COMMAND OPTIONS...]

`order` commits a `Charge` (the order) and, with `outbox`, an outbox message to URL in the same
transaction; with `on-commit`, a `transaction.on_commit` callback that would POST to URL. Either
way the process is SIGKILLed right after the commit, before any on_commit callback runs.

`relay` is ``python -m django idempotency_relay`` (IDEMPOTENCY_CRASH_AT arms its crash points);
with `--ready` and `--go`, it sets Django up, creates `--ready`, and starts relaying only once
`--go` exists, so that several relays start at the same moment.

The database is the one in DATABASE_URL (tests.clock_processes.environment gives the test's).
Each process ends by itself after LIFETIME seconds (SIGALRM), even if the test that started it
died first.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from signal import alarm

LIFETIME = 90  # Seconds.


def place_order(how: str, reference: str, url: str) -> None:
    import django

    django.setup()
    import httpx
    from django.db import transaction

    from django_idempotency import crashes
    from django_idempotency.outbox import enqueue_request
    from tests.models import Charge

    def send() -> None:
        httpx.post(url, json={"order": reference}, timeout=10).raise_for_status()

    with transaction.atomic():
        # Registered first, so run first once the commit returns: the machine is lost with the
        # order committed and nothing else done, before any other callback could run.
        transaction.on_commit(crashes.kill)
        Charge.objects.create(reference=reference, amount=1)
        if how == "outbox":
            enqueue_request("POST", url, json_body={"order": reference})
        elif how == "on-commit":
            transaction.on_commit(send)
        else:
            raise SystemExit(f"unknown way of sending {how!r}")
    raise SystemExit("still running after the commit")  # Unreachable: killed by then.


def relay(argv: list[str]) -> None:
    from django.core.management import execute_from_command_line

    if argv[:1] == ["--ready"]:
        ready, go, argv = Path(argv[1]), Path(argv[3]), argv[4:]
        import django

        django.setup()  # The slow part: done before the start, for all relays to start at once.
        ready.touch()
        while not go.exists():
            time.sleep(0.005)
    execute_from_command_line(["django", "idempotency_relay", *argv])


def main(role: str, *args: str) -> None:
    alarm(LIFETIME)  # SIGALRM's default action ends the process.
    if role == "order":
        place_order(*args)
    elif role == "relay":
        relay(list(args))
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main(*sys.argv[1:])
