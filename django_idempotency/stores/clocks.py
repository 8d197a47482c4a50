"""One clock for every decision that a lease or a record has ended: the store's, not a server's."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.utils import timezone

from django_idempotency.exceptions import StoreUnavailable

logger = logging.getLogger("django_idempotency")

# Seconds between two readings of a store's clock. In between, the local monotonic clock counts
# the time: it drifts by a few milliseconds a minute at most, and a step of the store's own
# clock (an NTP correction on its server) is seen at the next reading.
REFRESH = 60.0
# Seconds before a reading that failed is tried again; the last good one serves meanwhile, so
# that a store gone for a while costs one failed reading a second, not one per call.
RETRY = 1.0

# A reading is within half its round trip of the store's time. The first of a process also
# opens the connection (imports a client library, even): one that took longer than twice TIGHT
# seconds is read again, up to READINGS times, and the tightest kept.
TIGHT = 0.005
READINGS = 3

_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def elapsed() -> float:
    """Seconds on a clock that never steps and keeps counting while the process is paused
    (SIGSTOP, a VM pause) or the machine sleeps: Linux's CLOCK_BOOTTIME, elsewhere the
    monotonic clock. A process paused past its lease must find its view of the store's clock
    moved on by the whole pause, or it would believe its lease still live."""
    if _BOOTTIME is not None:
        return time.clock_gettime(_BOOTTIME)
    return time.monotonic()


def as_now(seconds: float) -> datetime:
    """POSIX `seconds` as `django.utils.timezone.now()` gives a moment: aware UTC with
    USE_TZ, naive local time without (the second pass of a repeated hour with fold=1)."""
    if settings.USE_TZ:
        return datetime.fromtimestamp(seconds, tz=UTC)
    return datetime.fromtimestamp(seconds)


def later(moment: datetime, duration: timedelta) -> datetime:
    """`moment + duration` as a store compares it with a later `now`: the end of a lease or of
    a record's TTL.

    Naive local time (USE_TZ = False) skips an hour when the clocks go forward: a naive sum
    across that hour would end an hour early against the clock that jumped, and a live lease
    would be taken over (a record expire before its TTL). So the later of the naive sum and the
    naive time `duration` after `moment` in fact. When the clocks go back, the naive sum is the
    later one: a naive end then lasts up to an hour longer, never shorter.
    """
    end = moment + duration
    if moment.tzinfo is not None:
        return end
    zone = timezone.get_default_timezone()
    actual = moment.replace(tzinfo=zone).astimezone(UTC) + duration
    in_fact = actual.astimezone(zone).replace(tzinfo=None)
    return in_fact if in_fact > end else end


@dataclass(frozen=True)
class Reading:
    """A store clock's reading: its time is `elapsed() + offset`, within `uncertainty`."""

    offset: float
    uncertainty: float  # Seconds: half the round trip of the reading.
    due: float  # `elapsed()` when the clock is read again.


class StoreClock:
    """A store's clock, read now and then and advanced by `elapsed()` in between.

    `read` returns the store's time as POSIX seconds, and raises `StoreUnavailable` when the
    store cannot be reached. Reading it for every request would cost a query each; once a
    minute costs nothing measurable, and every server reading the same store sees the same
    time within the readings' round trips, whatever its own wall clock says.
    """

    def __init__(self, read: Callable[[], float]) -> None:
        self._read = read
        self._reading: Reading | None = None  # Replaced whole: threads share it unlocked.

    def now(self) -> datetime:
        """The store's time, as `django.utils.timezone.now()` gives a moment."""
        return as_now(self.seconds())

    def seconds(self) -> float:
        """The store's time, POSIX seconds."""
        reading, moment = self._reading, elapsed()
        if reading is None or moment >= reading.due:
            reading = self.read(fallback=reading)
            moment = elapsed()
        return moment + reading.offset

    def read(self, fallback: Reading | None = None) -> Reading:
        """Read the store's clock now: the tightest of up to READINGS readings, the first
        within TIGHT kept at once. If it cannot be read, `fallback` (the last reading) serves
        until the next try; without one, `StoreUnavailable` is raised."""
        best: Reading | None = None
        for _ in range(READINGS):
            before = elapsed()
            try:
                seconds = self._read()
            except StoreUnavailable as exc:
                if best is not None:
                    break
                if fallback is None:
                    raise
                logger.warning(
                    "Could not read the idempotency store's clock (retried in %.0f s; the last"
                    " reading serves meanwhile): %s",
                    RETRY,
                    exc,
                )
                best = Reading(fallback.offset, fallback.uncertainty, before + RETRY)
                break
            after = elapsed()
            # The store answered somewhere within the round trip: its middle is the best guess.
            middle = (before + after) / 2
            reading = Reading(seconds - middle, (after - before) / 2, after + REFRESH)
            if best is None or reading.uncertainty < best.uncertainty:
                best = reading
            if best.uncertainty <= TIGHT:
                break
        assert best is not None
        self._reading = best
        return best

    @property
    def uncertainty(self) -> float | None:
        """How far the last reading may be from the store's time, in seconds (None: unread)."""
        reading = self._reading
        return None if reading is None else reading.uncertainty
