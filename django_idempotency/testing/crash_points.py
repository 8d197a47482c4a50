"""Crash a project's own view, function, task or relay at a named point, to prove it runs once."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Literal

from django_idempotency import crashes
from django_idempotency.crashes import ENVIRONMENT_VARIABLE, POINTS, CrashPoint

__all__ = ["POINTS", "CrashPoint", "crash_at", "crash_environment"]

Action = Literal["raise", "kill"]


@contextlib.contextmanager
def crash_at(
    point: str, *, action: Action | Callable[[], None] = "raise", on: int = 1
) -> Iterator[None]:
    """Within the block, crash this process at `point` (see `POINTS`; "step.ran:charge" for
    one step) on arrival number `on`.

    ``action="raise"`` (the default) raises `CrashPoint` there, which no ``except Exception``
    catches: with the test client, the request raises it. The package cleans up as after the
    work raised (a claim with stored steps stays for the retry to resume, one without is given
    back); what happened before the point stays done (a step's call, a message sent and not
    marked). ``"kill"`` SIGKILLs the process, leaving the claim held until its lease ends: for
    a server, worker or relay the test starts, armed with `crash_environment`. A callable runs
    in the point's place (to stall there, or act as another process would at that moment).
    """
    outer = crashes.armed(point)  # A block around this one, armed at the same point.
    crashes.arm(point, crashes.ACTIONS[action] if isinstance(action, str) else action, on=on)
    try:
        yield
    finally:
        crashes.disarm(point)
        if outer is not None:
            crashes.rearm(point, outer)


def crash_environment(*points: str, action: Action = "kill") -> dict[str, str]:
    """The environment to start a server, a worker or a relay with, so that it crashes at each
    of `points` ("outbox.sent", "step.ran:charge@2" for the second arrival)."""
    spec = ",".join(f"{point}={action}" for point in points)
    crashes.parse(spec)  # A misspelt point fails here, not silently in the child.
    return {ENVIRONMENT_VARIABLE: spec}
