"""When an outbound call is retried and how long it waits: exponential backoff, full jitter."""

from __future__ import annotations

import asyncio
import enum
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC
from email.utils import parsedate_to_datetime

# Statuses that say "try again": the downstream still runs this key (409), too many requests
# (429), a gateway or the service itself is momentarily unable (502, 503, 504).
RETRIED_STATUSES = frozenset({409, 429, 502, 503, 504})
# "Your request is wrong": the same request gets the same answer, whatever a header says.
WRONG_REQUEST_STATUSES = frozenset({400, 422})
# A downstream's own say on retrying, where one is common: Stripe's.
SHOULD_RETRY_HEADER = "Stripe-Should-Retry"
# Retry-After's delta-seconds (RFC 9110 §10.2.3): one or more ASCII digits.
_DELTA_SECONDS = re.compile(r"[0-9]+")


class Failure(enum.Enum):
    """An attempt that got no answer."""

    UNSENT = "unsent"  # The connection was never made: the request did not leave.
    LOST = "lost"  # It may have left (a read timeout, a dropped connection): the answer is lost.


@dataclass(frozen=True)
class Result:
    """What one attempt came back with: an answer (status and headers) or a failure."""

    status: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)  # Case-insensitive in practice.
    failure: Failure | None = None
    error: str = ""  # The exception's class name, for the journal and the signal.

    def header(self, name: str) -> str | None:
        value = self.headers.get(name)
        if value is None:  # A plain dict given by a caller: look it up without case.
            lowered = name.lower()
            value = next((v for k, v in self.headers.items() if k.lower() == lowered), None)
        return value


@dataclass(frozen=True)
class Decision:
    """Retry after `delay` seconds, or stop; `reason` says why, for the log."""

    retry: bool
    delay: float = 0.0
    reason: str = ""


async def _asyncio_sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


@dataclass(frozen=True)
class RetryPolicy:
    """How an outbound call is retried; every attempt sends the same key.

    The delay before retry n (1 for the first retry) is drawn with full jitter,
    ``random(0, min(max_delay, base_delay * 2 ** (n - 1)))``, unless the answer carries a
    `Retry-After` (seconds or an HTTP date), which is waited for as given: one longer than
    `retry_after_cap` stops the retries and the answer is returned to the caller. No attempt
    starts after `deadline` seconds from the first, and none after `max_attempts`.

    `sleep`, `async_sleep`, `random`, `clock` (monotonic seconds, for the deadline) and `now`
    (epoch seconds, for Retry-After dates) can be replaced, so that tests see the delays asked
    for without waiting them.
    """

    max_attempts: int = 5
    deadline: float = 30.0
    base_delay: float = 0.5
    max_delay: float = 8.0
    retry_after_cap: float = 20.0
    retried_statuses: frozenset[int] = RETRIED_STATUSES
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False, repr=False)
    async_sleep: Callable[[float], Awaitable[None]] = field(
        default=_asyncio_sleep, compare=False, repr=False
    )
    random: Callable[[float, float], float] = field(
        default=random.uniform, compare=False, repr=False
    )
    clock: Callable[[], float] = field(default=time.monotonic, compare=False, repr=False)
    now: Callable[[], float] = field(default=time.time, compare=False, repr=False)

    def __post_init__(self) -> None:
        if type(self.max_attempts) is not int or self.max_attempts < 1:
            raise ValueError(
                f"max_attempts must be an int of 1 or more, not {self.max_attempts!r}."
            )
        for name in ("deadline", "base_delay", "max_delay", "retry_after_cap"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a number of seconds (0 or more), not {value!r}.")

    def backoff(self, retry: int) -> float:
        """The jittered delay before retry number `retry` (1 for the first)."""
        return self.random(0.0, min(self.max_delay, self.base_delay * 2 ** (retry - 1)))

    def decide(self, result: Result, *, attempt: int, elapsed: float, keyed: bool) -> Decision:
        """Retry or not after attempt number `attempt` (1 for the first), `elapsed` seconds after
        the first started. `keyed`: the request carries a key, or its method is safe."""
        if result.status is not None and result.status < 400:
            return Decision(False, reason="answered")
        if not keyed:
            return Decision(False, reason="an unsafe request without a key is sent once")
        if not self._retryable(result):
            return Decision(False, reason="not a retryable answer")
        if attempt >= self.max_attempts:
            return Decision(False, reason=f"{self.max_attempts} attempts made")
        delay = self.backoff(attempt)
        if result.status is not None:
            asked = retry_after(result.header("Retry-After"), self.now())
            if asked is not None:
                if asked > self.retry_after_cap:
                    return Decision(
                        False,
                        reason=f"Retry-After {asked:.0f} s is over the cap of "
                        f"{self.retry_after_cap:.0f} s",
                    )
                delay = asked
        if elapsed + delay >= self.deadline:
            return Decision(False, reason=f"the deadline of {self.deadline:.0f} s is near")
        return Decision(True, delay)

    def _retryable(self, result: Result) -> bool:
        if result.status is None:
            return result.failure is not None
        if result.status in WRONG_REQUEST_STATUSES:
            return False
        said = (result.header(SHOULD_RETRY_HEADER) or "").strip().lower()
        if said == "false":
            return False
        return said == "true" or result.status in self.retried_statuses


def retry_after(value: str | None, now: float) -> float | None:
    """Seconds a `Retry-After` value asks to wait (delta-seconds or an HTTP date), or None when
    there is none or it cannot be read."""
    if value is None:
        return None
    value = value.strip(" \t")
    # By RFC 9110's grammar, ASCII digits only: str.isdigit() also takes "²" or "٣", which
    # float() refuses.
    if _DELTA_SECONDS.fullmatch(value):
        return float(value)  # inf for absurd lengths: over any cap.
    try:
        when = parsedate_to_datetime(value)
        if when.tzinfo is None:  # An HTTP date is always GMT ("-0000" parses without a zone).
            when = when.replace(tzinfo=UTC)
        return max(0.0, when.timestamp() - now)
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
