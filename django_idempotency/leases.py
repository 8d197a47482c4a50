"""Lease renewal: one daemon thread per process keeps every held lease-mode claim's lease alive."""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol

from django.db import connections
from django.utils import timezone

from django_idempotency.core.outcomes import Claim
from django_idempotency.exceptions import StoreUnavailable
from django_idempotency.stores import BaseStore

logger = logging.getLogger("django_idempotency")

# A renewal is due a third of the way through the lease: two more chances before it runs out.
BEATS_PER_LEASE = 3
# The thread wakes at most this often (seconds): renewals due within it go in one round, and a
# stream of short requests, whose holds all end before they are due, does not wake it each.
NAP = 0.05
# Ended holds the schedule may keep before it is rebuilt without them (when they are most of it).
COMPACT_AFTER = 1024


class Holder(Protocol):
    """What the heartbeat needs of the work holding a claim (an `attempts.Attempt`)."""

    store: BaseStore
    claim: Claim | None

    def lose(self) -> None:
        """The claim was taken over (or ended by someone else): stop before the next effect."""


@dataclass(eq=False)
class Hold:
    """One claim kept alive: until `ended`, renewed every `lease / BEATS_PER_LEASE`."""

    holder: Holder
    lease: timedelta
    due: float = 0.0  # time.monotonic() of the next renewal.
    ended: bool = False
    order: int = field(default=0, repr=False)  # Ties in `due` keep their order in the heap.
    # Held while a renewal is under way: ending the hold waits for it, so that no renewal
    # lands after the claim's last write (a lease ended on failure would be extended again).
    renewing: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def interval(self) -> float:
        return self.lease.total_seconds() / BEATS_PER_LEASE


class Heartbeat:
    """A schedule of due renewals, served by one daemon thread, started by the first hold.

    Holding and ending a hold touch only memory: work that ends before its first renewal is
    due costs no query and no connection. The thread renews through the holder's store, in
    its own database connections, which it closes after each round so that none stays open
    while it sleeps. It never touches an event loop: async work's leases are renewed the same
    way as sync work's.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._wake = threading.Condition()
        self._due: list[tuple[float, int, Hold]] = []
        self._ended = 0  # Ended holds still in the schedule (it drops them as they come due).
        self._counter = itertools.count()
        self._thread: threading.Thread | None = None
        self._unrenewable: set[type[BaseStore]] = set()

    def hold(self, holder: Holder, lease: timedelta) -> Hold:
        """Renew `holder`'s lease every third of `lease` until `end` is called."""
        if os.getpid() != self._pid:
            self._reset()  # A forked child: the parent's thread and schedule are not its own.
        hold = Hold(holder, lease)
        hold.due = time.monotonic() + hold.interval
        with self._wake:
            self._push(hold)
            if self._due[0][2] is hold:
                self._wake.notify()  # Sooner than the thread was to wake (or it waits for none).
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._serve, name="django-idempotency-heartbeat", daemon=True
                )
                self._thread.start()
        return hold

    def end(self, hold: Hold) -> None:
        """Renew no more; holds that ended at the head of the schedule are dropped at once, so
        that the thread does not wake for them."""
        with hold.renewing:
            hold.ended = True
        with self._wake:
            self._ended += 1
            while self._due and self._due[0][2].ended:
                heapq.heappop(self._due)
                self._ended -= 1
            if self._ended > COMPACT_AFTER and 2 * self._ended > len(self._due):
                # Ended holds behind a long one: rebuilt without them, so that the schedule
                # stays as large as the work running, not as the requests of the last lease.
                self._due = [entry for entry in self._due if not entry[2].ended]
                heapq.heapify(self._due)
                self._ended = 0

    def beat(self) -> None:
        """Renew every live hold now, in the calling thread: what tests drive a round with."""
        with self._wake:
            holds = [hold for _, _, hold in self._due if not hold.ended]
        for hold in holds:
            self._renew(hold)

    def _push(self, hold: Hold) -> None:
        hold.order = next(self._counter)
        heapq.heappush(self._due, (hold.due, hold.order, hold))

    def _serve(self) -> None:
        while True:
            with self._wake:
                now = time.monotonic()
                while self._due and self._due[0][2].ended:
                    heapq.heappop(self._due)
                    self._ended -= 1
                if not self._due:
                    self._wake.wait()
                    continue
                if self._due[0][0] > now:
                    self._wake.wait(max(self._due[0][0] - now, NAP))
                    continue
                due = []
                while self._due and self._due[0][0] <= now + NAP:
                    hold = heapq.heappop(self._due)[2]
                    if hold.ended:
                        self._ended -= 1
                    else:
                        due.append(hold)
            self._round(due)

    def _round(self, due: list[Hold]) -> None:
        try:
            for hold in due:
                if not hold.ended and self._renew(hold):
                    hold.due = time.monotonic() + hold.interval
                    with self._wake:
                        if not hold.ended:
                            self._push(hold)
        finally:
            # Never left open while the thread sleeps (CONN_MAX_AGE would keep it otherwise).
            for connection in connections.all(initialized_only=True):
                connection.close()

    def _renew(self, hold: Hold) -> bool:
        """Renew one hold's lease; whether to keep renewing it."""
        with hold.renewing:
            if hold.ended:
                return False
            return self._renew_held(hold)

    def _renew_held(self, hold: Hold) -> bool:
        holder, claim = hold.holder, hold.holder.claim
        if claim is None or type(holder.store) in self._unrenewable:
            return False
        try:
            renewed = holder.store.renew(claim, timezone.now() + hold.lease)
        except StoreUnavailable as exc:
            # The work goes on: the store may be back before the lease runs out.
            logger.warning(
                "Could not renew an idempotency lease (retried in %.1f s): %s", hold.interval, exc
            )
            return True
        except NotImplementedError:
            self._unrenewable.add(type(holder.store))
            logger.warning(
                "%s does not implement renew(): leases are not renewed, so work longer than"
                " its lease may run twice. Implement renew() (see the store contract).",
                type(holder.store).__qualname__,
            )
            return False
        except Exception:
            logger.exception("Could not renew an idempotency lease; retried at the next beat")
            return True
        if not renewed:
            # Taken over (the lease ran out while this process stalled) or released by an
            # operator: the work learns it before its next step or outbound call.
            logger.warning(
                "An idempotency lease could not be renewed: the key was taken over or released."
                " The work stops at its next step; its result will not be stored."
            )
            holder.lose()
        return renewed


_heartbeat = Heartbeat()


def heartbeat() -> Heartbeat:
    """The process's heartbeat."""
    return _heartbeat
