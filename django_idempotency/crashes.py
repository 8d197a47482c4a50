"""Named points where a test may crash the process; `django_idempotency.testing` arms them.

The package calls `reached(name)` at each point. Nothing is armed in production: the call is
one check of an empty dict. A test arms a point in its own process (`testing.crash_at`) or, for a
server or worker it starts, through the environment variable ``IDEMPOTENCY_CRASH_AT``, read when
the app is ready: ``"outbox.sent"``, ``"step.ran:charge@2=raise"`` (the second time, raising),
several separated by commas. The action is ``kill`` (SIGKILL, the default: nothing runs after
it, as when a machine is lost: the claim holds until its lease ends) or ``raise`` (`CrashPoint`,
an exception the code around the point does not expect: the package cleans up as it does after
the work raised).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

ENVIRONMENT_VARIABLE = "IDEMPOTENCY_CRASH_AT"

# Every point the package reaches, for `crash_at` to refuse a misspelt one. A point with a
# ":" takes the name of what it is about (a step's) after it.
POINTS = {
    "claimed": "A view, function or task claimed its key; its work has not started.",
    "step.ran": "A step's function returned; its result is not stored yet (step.ran:NAME).",
    "step.saved": "A step's result is stored (step.saved:NAME).",
    "completing": "The work returned; its response or result is not stored yet.",
    "completed": "The response or result is stored; the caller has not been answered yet.",
    "outbox.claimed": "A relay claimed a batch of messages; none is sent yet.",
    "outbox.sent": "A message was sent (the broker took it, the receiver answered); it is not "
    "marked sent yet.",
    "outbox.marked": "A message is marked sent.",
}


class CrashPoint(BaseException):
    """Raised at an armed point whose action is ``raise``: a BaseException, as SystemExit, so
    that no ``except Exception`` around the point handles it as an error it expects."""


@dataclass
class Crash:
    """What happens at an armed point, and on which arrival there."""

    action: Callable[[], None]
    on: int = 1  # The arrival (1 for the first) that crashes.
    arrivals: int = field(default=0, compare=False)


_armed: dict[str, Crash] = {}
_lock = threading.Lock()


def reached(point: str, about: str = "") -> None:
    """The process is at `point` (about `about`, a step's name): crash if a test armed it."""
    if not _armed:
        return
    crash = _armed.get(f"{point}:{about}") if about else None
    if crash is None:
        crash = _armed.get(point)
    if crash is None:
        return
    with _lock:
        crash.arrivals += 1
        due = crash.arrivals == crash.on
    if due:
        crash.action()


def kill() -> None:
    """SIGKILL this process: no `finally`, no `atexit`, no flush; as a lost machine."""
    os.kill(os.getpid(), signal.SIGKILL)


def raise_crash() -> None:
    raise CrashPoint("crashed at an armed crash point")


ACTIONS: dict[str, Callable[[], None]] = {"kill": kill, "raise": raise_crash}


def arm(point: str, action: Callable[[], None] = kill, *, on: int = 1) -> None:
    """Crash at `point` ("step.ran:charge" for one step) on arrival number `on`."""
    _armed[point] = Crash(action, _checked(point, on))


# The points that take the name of what they are about ("step.ran:charge").
NAMED = frozenset({"step.ran", "step.saved"})


def _checked(point: str, on: int) -> int:
    """`on`, once `point` is known to be one the package reaches: a point that never fires
    would let a test pass without the crash it asked for."""
    name, colon, about = point.partition(":")
    if name not in POINTS:
        raise ValueError(f"No crash point is named {name!r}; the points are {', '.join(POINTS)}.")
    if colon and (name not in NAMED or not about.strip() or "@" in about):
        raise ValueError(
            f"{point!r} is never reached: only {' and '.join(sorted(NAMED))} take a step's name "
            "after a colon (on=N, or @N in IDEMPOTENCY_CRASH_AT, for the arrival)."
        )
    if type(on) is not int or on < 1:
        raise ValueError(f"on must be an int of 1 or more, not {on!r}.")
    return on


def armed(point: str) -> Crash | None:
    """What `point` is armed with, if anything."""
    return _armed.get(point)


def rearm(point: str, crash: Crash) -> None:
    """Arm `point` again as it was (its arrivals counted so far included)."""
    _armed[point] = crash


def disarm(point: str | None = None) -> None:
    """Disarm `point`, or every point."""
    if point is None:
        _armed.clear()
    else:
        _armed.pop(point, None)


def parse(spec: str) -> list[tuple[str, str, int]]:
    """(point, action, arrival) of each ``POINT[@N][=ACTION]`` in `spec`, separated by commas;
    `ValueError` for one that names no point or action."""
    parsed = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        point, _, action = item.partition("=")
        point, _, on = point.partition("@")
        action = action.strip() or "kill"
        if action not in ACTIONS:
            raise ValueError(
                f"{ENVIRONMENT_VARIABLE}: {action!r} is not an action; use kill or raise."
            )
        try:
            arrival = int(on) if on else 1
        except ValueError:
            raise ValueError(f"{ENVIRONMENT_VARIABLE}: {on!r} is not an arrival number.") from None
        parsed.append((point.strip(), action, _checked(point.strip(), arrival)))
    return parsed


def arm_from_environment(value: str | None = None) -> None:
    """Arm the points named by ``IDEMPOTENCY_CRASH_AT`` (or `value`), as `parse` reads them."""
    spec = os.environ.get(ENVIRONMENT_VARIABLE, "") if value is None else value
    for point, action, on in parse(spec):
        arm(point, ACTIONS[action], on=on)
