"""Lease renewal: one daemon thread per process keeps every held lease-mode claim's lease alive."""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol

from django.db import connections

from django_idempotency import threads
from django_idempotency.core.outcomes import Claim
from django_idempotency.exceptions import StoreUnavailable
from django_idempotency.stores import BaseStore, RecordLocked
from django_idempotency.stores.clocks import later

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
    # Native: the heartbeat's thread is native even where `threading` runs greenlets.
    renewing: threads.Lock = field(default_factory=threads.Lock, repr=False)
    schedule: Heartbeat | None = field(default=None, repr=False)  # The heartbeat serving it.

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

    The thread is a native OS thread, and its locks native ones, also under gevent: there
    `threading.Thread` would make a greenlet of it, which work computing without yielding
    (longer than its lease) would starve, and another worker would take its key over. Only the
    leases of a store whose connections belong to the greenlets there (`BaseStore.
    greenlet_bound_connections`; the Redis store opens clients of the thread's own instead) are
    renewed by a second heartbeat, a greenlet (`native=False`), with a warning.
    """

    def __init__(self, *, native: bool = True) -> None:
        self._native = native
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._schedule = threads.Lock()  # Guards what follows (a hold's flags: its `renewing`).
        self._wakeup = threads.Wakeup(native=self._native)
        self._greenlets: Heartbeat | None = None  # Under gevent, for greenlet-bound stores.
        self._due: list[tuple[float, int, Hold]] = []
        self._ended = 0  # Ended holds still in the schedule (it drops them as they come due).
        self._counter = itertools.count()
        self._serving = False  # The thread is started (and has not died).
        # When the thread looks at the schedule next: the end of its sleep (inf: until woken),
        # or -inf while it is not sleeping (starting, or renewing). A hold due later than that
        # needs no wake-up: each request's hold would otherwise wake it for nothing.
        self._wakes_at = -math.inf
        self._unrenewable: set[type[BaseStore]] = set()
        self._warned: set[object] = set()  # What this process was warned about, once.

    def hold(self, holder: Holder, lease: timedelta) -> Hold:
        """Renew `holder`'s lease every third of `lease` until `end` is called."""
        if os.getpid() != self._pid:
            self._reset()  # A forked child: the parent's thread and schedule are not its own.
        if not self._serves(holder.store):
            if self._greenlets is None:
                self._greenlets = Heartbeat(native=False)
            return self._greenlets.hold(holder, lease)
        hold = Hold(holder, lease, schedule=self)
        hold.due = time.monotonic() + hold.interval
        with self._schedule:
            self._push(hold)
            if hold.due < self._wakes_at:
                self._wakeup.set()  # Sooner than the thread was to wake (or it waits for none).
            starting, self._serving = not self._serving, True
        if starting:
            threads.start_thread(self._serve, "django-idempotency-heartbeat", native=self._native)
        return hold

    def _serves(self, store: BaseStore) -> bool:
        """Whether this heartbeat renews `store`'s leases. Under gevent the native one does not
        renew those of a store whose connections belong to the greenlets' thread: it must not
        use them, and leaves them to a greenlet, which work that does not yield starves."""
        library = threads.green()
        if library == "eventlet":
            self._warn_once(
                "eventlet",
                "Under eventlet, idempotency leases are renewed by a green thread, which work"
                " that computes without yielding starves: such work longer than its lease may"
                " run twice. Keep the lease above its longest run, or serve with gevent or"
                " threads.",
            )
        if not self._native or library != "gevent" or not store.greenlet_bound_connections:
            return True
        self._warn_once(
            type(store),
            f"Under gevent, the leases of {type(store).__qualname__} are renewed by a greenlet:"
            " its connections belong to the greenlets, which the heartbeat's native thread must"
            " not use. Work that computes without yielding longer than its lease may run twice:"
            " keep the lease above its longest run, or use the database store.",
        )
        return False

    def _warn_once(self, about: object, message: str) -> None:
        if about not in self._warned:
            self._warned.add(about)
            logger.warning(message)

    def end(self, hold: Hold) -> None:
        """Renew no more; holds that ended at the head of the schedule are dropped at once, so
        that the thread does not wake for them."""
        if hold.schedule is not None and hold.schedule is not self:
            hold.schedule.end(hold)  # A greenlet-bound store's: the greenlets' heartbeat.
            return
        with hold.renewing:
            if hold.ended:
                return
            hold.ended = True
        with self._schedule:
            self._ended += 1
            self._drop_ended_heads()
            if self._ended > COMPACT_AFTER and 2 * self._ended > len(self._due):
                # Ended holds behind a long one: rebuilt without them, so that the schedule
                # stays as large as the work running, not as the requests of the last lease.
                self._due = [entry for entry in self._due if not entry[2].ended]
                heapq.heapify(self._due)
                self._ended = 0

    def beat(self) -> None:
        """Renew every live hold now, in the calling thread: what tests drive a round with."""
        with self._schedule:
            holds = [hold for _, _, hold in self._due if not hold.ended]
        for hold in holds:
            self._renew(hold)
        if self._greenlets is not None:
            self._greenlets.beat()

    def renew_now(self, hold: Hold) -> None:
        """Renew one hold now, in the calling thread: once the caller's transaction that kept
        its record locked (a step saved inside it) commits, rather than at the next beat."""
        self._renew(hold)

    def _push(self, hold: Hold) -> None:
        hold.order = next(self._counter)
        heapq.heappush(self._due, (hold.due, hold.order, hold))

    def _drop_ended_heads(self) -> None:
        while self._due and self._due[0][2].ended:
            heapq.heappop(self._due)
            self._ended -= 1

    def _serve(self) -> None:
        try:
            while True:
                due, sleep = self._next()
                if due:
                    self._round(due)
                else:
                    self._wakeup.wait(sleep)
        finally:
            with self._schedule:  # Started again by the next hold.
                self._serving = False

    def _next(self) -> tuple[list[Hold], float | None]:
        """The holds due now (or within a NAP), taken off the schedule; if none, how long to
        sleep (None: until a hold wakes the thread)."""
        with self._schedule:
            now = time.monotonic()
            self._drop_ended_heads()
            if not self._due:
                self._wakes_at = math.inf
                return [], None
            if self._due[0][0] > now:
                sleep = max(self._due[0][0] - now, NAP)
                self._wakes_at = now + sleep
                return [], sleep
            self._wakes_at = -math.inf  # Renewing: it looks at the schedule again after.
            due = []
            while self._due and self._due[0][0] <= now + NAP:
                hold = heapq.heappop(self._due)[2]
                if hold.ended:
                    self._ended -= 1
                else:
                    due.append(hold)
            return due, 0.0

    def _round(self, due: list[Hold]) -> None:
        try:
            for hold in due:
                if not hold.ended and self._renew(hold):
                    hold.due = time.monotonic() + hold.interval
                    with self._schedule:
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
            renewed = holder.store.renew(claim, later(holder.store.now(), hold.lease))
        except RecordLocked as exc:
            # Another transaction holds the record: the work's own around a step (whose write
            # moved the lease on itself, and which renews it again once committed), or one of
            # the project's. Not waited for, so the process's other leases are renewed on time.
            logger.info(
                "An idempotency lease was not renewed now (retried in %.1f s): %s",
                hold.interval,
                exc,
            )
            return True
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
