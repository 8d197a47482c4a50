"""The relay: claims due messages in batches, sends each under a fenced claim, marks it sent."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import connections, transaction
from django.db.models import Exists, OuterRef, Q

from django_idempotency import crashes, signals
from django_idempotency.models import OutboxMessage
from django_idempotency.outbound.calls import target_of
from django_idempotency.outbound.policy import RetryPolicy
from django_idempotency.outbox.delivery import Delivery, RequestSender, Verdict, send_task
from django_idempotency.outbox.messages import outbox_alias
from django_idempotency.stores.clocks import later
from django_idempotency.stores.database import clock_for
from django_idempotency.stores.dialects import MariaDB

logger = logging.getLogger("django_idempotency")

State = OutboxMessage.State

BATCH_SIZE = 100
# How long a relay holds a message it is sending: renewed before each send, so it covers one
# delivery (a request's retries within the outbound client's deadline). A relay that died
# holding messages leaves them to the next relay once this is over.
LEASE = timedelta(seconds=60)
# Between deliveries of one message: the outbound client's backoff (full jitter, its ceiling
# doubling from 2 s), then dead after 10 deliveries: at most about 17 minutes in all.
POLICY = RetryPolicy(max_attempts=10, base_delay=2.0, max_delay=600.0, deadline=float("inf"))


@dataclass
class RelayReport:
    """What one run of the relay did."""

    sent: int = 0
    retried: int = 0  # Not delivered; tried again after the backoff.
    dead: int = 0
    lost: int = 0  # Taken over by another relay before this one sent it.

    def add(self, other: RelayReport) -> None:
        self.sent += other.sent
        self.retried += other.retried
        self.dead += other.dead
        self.lost += other.lost

    @property
    def handled(self) -> int:
        return self.sent + self.retried + self.dead + self.lost


class Relay:
    """Delivers the outbox of database `using` (the outbox's, by default).

    Several relays may run at once, in threads, processes and on several machines: each claims
    a batch with a token and a lease (skipping rows another holds where the database can), and
    renews its claim before each send, so two live relays never send one message. A relay that
    stalls past its lease may send a message another relay sent too; both carry the message's
    key, which the receiver runs once.
    """

    def __init__(
        self,
        *,
        using: str | None = None,
        batch_size: int = BATCH_SIZE,
        lease: timedelta = LEASE,
        policy: RetryPolicy = POLICY,
        app: Any = None,
        http_client: Any = None,
    ) -> None:
        if type(batch_size) is not int or batch_size < 1:
            raise ValueError(f"batch_size must be an int of 1 or more, not {batch_size!r}.")
        if not isinstance(lease, timedelta) or lease <= timedelta(0):
            raise ValueError(f"lease must be a timedelta above zero, not {lease!r}.")
        self.alias = using or outbox_alias()
        self.batch_size = batch_size
        self.lease = lease
        self.policy = policy
        self.app = app
        self.token = uuid.uuid4().hex
        self._stopping = False
        self._send_request = RequestSender(http_client)

    def run(self, *, max_batches: int | None = None) -> RelayReport:
        """Relay batches while they come full (or until `max_batches` ran): a batch with room
        left took every due message, and one retried now waits for the next run."""
        report = RelayReport()
        batches = 0
        while max_batches is None or batches < max_batches:
            batch = self.run_batch()
            report.add(batch)
            batches += 1
            if batch.handled < self.batch_size:
                break
        return report

    def run_batch(self) -> RelayReport:
        """Claim one batch of due messages and deliver each; once `stop()` was called, the
        message being sent is finished and the rest of the batch handed back at once."""
        if connections[self.alias].in_atomic_block:
            # What it read there may not be committed: a message sent now could be rolled back
            # with the transaction that wrote it, and the receiver would have it all the same.
            raise ImproperlyConfigured(
                "The outbox's relay runs inside a transaction on database "
                f"{self.alias!r} (transaction.atomic(), ATOMIC_REQUESTS, an eager task): run it "
                "outside, once the messages' transactions have committed."
            )
        report = RelayReport()
        claimed = self.claim()
        for index, message in enumerate(claimed):
            if self._stopping:
                ids = [left.id for left in claimed[index:]]
                OutboxMessage.objects.using(self.alias).filter(
                    id__in=ids, claim_token=self.token
                ).update(claim_token="", claimed_until=None)
                break
            self._deliver(message, report)
        return report

    def stop(self) -> None:
        """Finish the message being sent, then stop (a signal handler may call it)."""
        self._stopping = True

    def close(self) -> None:
        self._send_request.close()

    def now(self) -> datetime:
        return clock_for(self.alias).now()

    def claim(self) -> list[OutboxMessage]:
        """The due messages this relay now holds: the oldest first, and of each aggregate only
        its oldest undelivered one (a dead one holds its aggregate back until it is sent again
        or deleted)."""
        now = self.now()
        messages = OutboxMessage.objects.using(self.alias)
        earlier = messages.filter(aggregate=OuterRef("aggregate"), id__lt=OuterRef("id")).exclude(
            state=State.SENT
        )
        due = messages.filter(_claimable(now)).filter(Q(aggregate="") | ~Exists(earlier))
        connection = connections[self.alias]
        rows = due.order_by("id").values_list("id", flat=True)[: self.batch_size]
        if not connection.features.has_select_for_update:
            # SQLite: no row locks, one writer at a time. Read, then claim in autocommit: a
            # transaction that read first could not take the write lock while another relay
            # holds it ("database is locked"), where a lone UPDATE waits its turn.
            ids = list(rows)
            self._take(ids, now)
        else:
            outer = connection.in_atomic_block
            with transaction.atomic(using=self.alias):
                if connection.vendor == "mysql" and not outer:
                    # No gap locks: writers adding messages beside the batch never wait for it.
                    with connection.cursor() as cursor:
                        cursor.execute(MariaDB.read_committed)
                # Rows another relay is claiming right now are skipped, not waited for.
                skip_locked = connection.features.has_select_for_update_skip_locked
                ids = list(rows.select_for_update(skip_locked=skip_locked))
                self._take(ids, now)
        claimed = list(messages.filter(claim_token=self.token, id__in=ids).order_by("id"))
        if claimed:
            crashes.reached("outbox.claimed")
        return claimed

    def _take(self, ids: list[int], now: datetime) -> None:
        """Claim the messages `ids` that are still claimable: on SQLite, a message another
        relay claimed since this one read it is no longer."""
        if ids:
            OutboxMessage.objects.using(self.alias).filter(_claimable(now), id__in=ids).update(
                claim_token=self.token, claimed_until=later(now, self.lease)
            )

    def _deliver(self, message: OutboxMessage, report: RelayReport) -> None:
        messages = OutboxMessage.objects.using(self.alias)
        mine = messages.filter(id=message.id, claim_token=self.token, state=State.PENDING)
        now = self.now()
        # Fenced: a relay that stalled past its lease finds the message taken over, and skips it.
        if not mine.update(claimed_until=later(now, self.lease)):
            report.lost += 1
            _announce(message, "lost", "", 0.0)
            return
        started = time.perf_counter()
        delivery = self._send(message)
        duration = time.perf_counter() - started
        attempts = message.attempts + 1
        done = self.now()
        values: dict[str, Any] = {"last_error": delivery.error, **_released(attempts)}
        if delivery.verdict is Verdict.SENT:
            crashes.reached("outbox.sent")
            outcome, values = "sent", {**values, "state": State.SENT, "sent_at": done}
        elif delivery.verdict is Verdict.DEAD or attempts >= self.policy.max_attempts:
            outcome, values = "dead", {**values, "state": State.DEAD}
        else:
            retry_at = later(done, timedelta(seconds=self.policy.backoff(attempts)))
            outcome, values = "retried", {**values, "available_at": retry_at}
        if not mine.update(**values):
            # Taken over while this relay sent it (its lease ran out): the other relay's word
            # stands; what this one sent carried the same key.
            outcome = "lost"
        elif outcome == "sent":
            crashes.reached("outbox.marked")
        elif outcome == "dead":
            logger.warning(
                "outbox message %s (%s) is dead after %d deliveries: %s",
                message.pk,
                _shown(message),
                attempts,
                delivery.error,
            )
        else:
            logger.info(
                "outbox message %s (%s) not delivered (%s); tried again at %s",
                message.pk,
                _shown(message),
                delivery.error,
                values["available_at"],
            )
        setattr(report, outcome, getattr(report, outcome) + 1)
        _announce(message, outcome, delivery.error, duration)

    def _send(self, message: OutboxMessage) -> Delivery:
        if message.kind == OutboxMessage.Kind.TASK:
            return send_task(message, self.app)
        return self._send_request(message)


def relay_due(**options: Any) -> RelayReport:
    """Relay every due message once (`Relay`'s options); the beat task and the command's."""
    runner = Relay(**options)
    try:
        return runner.run()
    finally:
        runner.close()


def _shown(message: OutboxMessage) -> str:
    """A message's destination as logs show it: a URL without its query, which may hold
    secrets (as the outbound journal keeps it)."""
    if message.kind == OutboxMessage.Kind.TASK:
        return f"task {message.destination}"
    try:
        target = target_of(message.destination)[0]
    except ValueError:  # Written before URLs were checked: no log line may stop the relay.
        target = message.destination.split("?", 1)[0][:200]
    return f"{message.method} {target}"


def _claimable(now: datetime) -> Q:
    return Q(state=State.PENDING, available_at__lte=now) & (
        Q(claimed_until__isnull=True) | Q(claimed_until__lte=now)
    )


def _released(attempts: int) -> dict[str, Any]:
    return {"attempts": attempts, "claim_token": "", "claimed_until": None}


def _announce(message: OutboxMessage, outcome: str, error: str, duration: float) -> None:
    signals.outbox_delivery.send_robust(
        sender=OutboxMessage,
        message=message,
        outcome=outcome,
        error=error or None,
        duration=duration,
    )
