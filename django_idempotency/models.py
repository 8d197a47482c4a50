"""The stored record of one idempotency key: its claim, and once completed, its response."""

from __future__ import annotations

from datetime import datetime

from django.db import models
from django.utils.translation import gettext_lazy as _

from django_idempotency.core.keys import MAX_KEY_LENGTH, MAX_NAMESPACE_LENGTH, MAX_OWNER_LENGTH
from django_idempotency.core.outcomes import Status


class IdempotencyRecord(models.Model):
    class Status(models.TextChoices):
        IN_PROGRESS = Status.IN_PROGRESS.value, _("in progress")
        COMPLETED = Status.COMPLETED.value, _("completed")

    id = models.BigAutoField(primary_key=True)
    namespace = models.CharField(
        _("namespace"),
        max_length=MAX_NAMESPACE_LENGTH,
        help_text=_("Keyspace of the view or function."),
    )
    owner = models.CharField(
        _("owner"),
        max_length=MAX_OWNER_LENGTH,
        blank=True,
        help_text=_("Who sent the key (the user by default); empty for anonymous requests."),
    )
    key = models.CharField(
        _("key"), max_length=MAX_KEY_LENGTH, help_text=_("The client's idempotency key.")
    )
    fingerprint = models.CharField(
        _("fingerprint"),
        max_length=64,
        help_text=_("SHA-256 of the method, path with query and canonical body."),
    )
    status = models.CharField(
        _("status"),
        max_length=16,
        choices=Status.choices,
        help_text=_("In progress while a request holds the key; completed once stored."),
    )
    method = models.CharField(
        _("method"), max_length=16, blank=True, help_text=_("HTTP method of the first request.")
    )
    path = models.TextField(_("path"), blank=True, help_text=_("Path with query string."))
    response_status = models.PositiveSmallIntegerField(
        _("response status"), null=True, blank=True, help_text=_("Stored HTTP status code.")
    )
    response_reason = models.CharField(
        _("response reason"),
        max_length=255,
        blank=True,
        default="",
        db_default="",  # The store's own INSERT statements leave it out.
        help_text=_("Reason phrase the view chose; empty for the status's standard one."),
    )
    response_headers = models.JSONField(
        _("response headers"), default=list, blank=True, help_text=_("[name, value] pairs.")
    )
    response_body = models.BinaryField(
        _("response body"), null=True, blank=True, help_text=_("Stored body, byte for byte.")
    )
    lease_token = models.CharField(
        _("lease token"),
        max_length=32,
        blank=True,
        help_text=_("Identifies the request holding the claim; completion must present it."),
    )
    lease_expires_at = models.DateTimeField(
        _("lease expires at"),
        null=True,
        blank=True,
        help_text=_("After this, another request may take over an in-progress claim."),
    )
    steps = models.JSONField(
        _("steps"),
        null=True,
        blank=True,
        help_text=_(
            "Results of the steps a lease-mode operation completed (name: base64), which a retry"
            " of the same request skips."
        ),
    )
    operation_id = models.CharField(
        _("operation"),
        max_length=26,
        blank=True,
        default="",
        # Rows written without it (before the column existed, or by a server not yet upgraded
        # during a rolling deploy) have none: their outbound keys derive as they used to.
        db_default="",
        help_text=_(
            "Identity (a ULID) of the operation this record is: new with every new record, kept"
            " by the same request's retry after a crash. Outbound keys derive from it."
        ),
    )
    created_at = models.DateTimeField(
        _("created at"), help_text=_("When the key was claimed by its current request.")
    )
    completed_at = models.DateTimeField(
        _("completed at"), null=True, blank=True, help_text=_("When the response was stored.")
    )
    expires_at = models.DateTimeField(
        _("expires at"), help_text=_("After this, the key starts a new request.")
    )

    class Meta:
        db_table = "django_idempotency_record"
        verbose_name = _("idempotency record")
        verbose_name_plural = _("idempotency records")
        # Encrypted bodies and headers are shown in the admin only to holders of this one.
        permissions = [("view_decrypted_response", _("Can view decrypted stored responses"))]
        constraints = [
            models.UniqueConstraint(
                fields=["namespace", "owner", "key"], name="idempotency_record_scope_key_uniq"
            ),
        ]
        indexes = [
            models.Index(fields=["expires_at"], name="idempotency_expires_idx"),
            models.Index(
                fields=["lease_expires_at"],
                name="idempotency_in_progress_idx",
                condition=models.Q(status="in_progress"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.namespace}:{self.key}"


def abandoned(now: datetime) -> models.Q:
    """In-progress records whose lease ran out: the request holding them is gone."""
    return models.Q(status=IdempotencyRecord.Status.IN_PROGRESS, lease_expires_at__lte=now)


def reclaimable(now: datetime) -> models.Q:
    """The records a new request may take over: the database's form of
    `core.outcomes.is_abandoned` (abandoned, or expired without a live lease)."""
    return abandoned(now) | models.Q(
        models.Q(status=IdempotencyRecord.Status.COMPLETED) | models.Q(lease_expires_at=None),
        expires_at__lte=now,
    )


def purgeable(now: datetime) -> models.Q:
    """The records the purge deletes: expired, and not held by a live lease.

    An abandoned claim stays until it expires too: its attempt may have called another service
    before it crashed, and the same request's retry resumes it with its operation's identity
    (the outbound keys it sent) and its steps. Deleted, the retry would be a new operation and
    send new keys: the downstream would run the call again.
    """
    return models.Q(expires_at__lte=now) & reclaimable(now)


class OutboundCall(models.Model):
    """The journal of one outgoing call (one operation step, one key): every attempt of it.

    Written before the first attempt is sent, so that after a crash no row means "never sent"
    and a row still `sending` (or `ambiguous`) means "maybe sent": the retry resends its key.
    """

    class Outcome(models.TextChoices):
        SENDING = "sending", _("sending")
        CONFIRMED = "confirmed", _("confirmed")
        FAILED = "failed", _("failed")
        AMBIGUOUS = "ambiguous", _("ambiguous")

    id = models.BigAutoField(primary_key=True)
    key = models.CharField(
        _("key"),
        max_length=MAX_KEY_LENGTH,
        help_text=_("The Idempotency-Key sent downstream, the same on every attempt."),
    )
    namespace = models.CharField(
        _("operation namespace"),
        max_length=MAX_NAMESPACE_LENGTH,
        blank=True,
        help_text=_("Namespace of the operation that made the call; empty outside one."),
    )
    owner = models.CharField(
        _("operation owner"),
        max_length=MAX_OWNER_LENGTH,
        blank=True,
        help_text=_("Owner of the operation that made the call; empty outside one."),
    )
    operation_key = models.CharField(
        _("operation key"),
        max_length=MAX_KEY_LENGTH,
        blank=True,
        help_text=_("Key of the operation (view, function or task) that made the call."),
    )
    operation_id = models.CharField(
        _("operation"),
        max_length=26,
        blank=True,
        default="",
        db_default="",
        help_text=_(
            "Identity of the operation that made the call (its record's); empty outside one."
        ),
    )
    step = models.CharField(
        _("step"),
        max_length=MAX_KEY_LENGTH,
        blank=True,
        help_text=_("The step of the operation whose name the key was derived from."),
    )
    method = models.CharField(_("method"), max_length=16, help_text=_("HTTP method sent."))
    target = models.TextField(
        _("target"),
        help_text=_("scheme://host/path called; never the query string, which may hold secrets."),
    )
    host = models.CharField(
        _("host"), max_length=255, help_text=_("Host (and port) called, to filter by.")
    )
    attempts = models.PositiveIntegerField(
        _("attempts"), default=0, help_text=_("Attempts sent so far, over every run.")
    )
    last_status = models.PositiveSmallIntegerField(
        _("last status"),
        null=True,
        blank=True,
        help_text=_("Status of the last answer; empty when the last attempt got none."),
    )
    last_error = models.CharField(
        _("last error"),
        max_length=255,
        blank=True,
        help_text=_("Why the last attempt got no answer (a timeout, a refused connection)."),
    )
    outcome = models.CharField(
        _("outcome"),
        max_length=16,
        choices=Outcome.choices,
        help_text=_(
            "sending: maybe sent, no final answer yet; confirmed: the downstream answered "
            "with its decision; failed: definitely not done; ambiguous: sent, answer lost."
        ),
    )
    replayed = models.BooleanField(
        _("replayed"),
        default=False,
        help_text=_("The last answer was a replay of an earlier one (Idempotent-Replayed)."),
    )
    created_at = models.DateTimeField(
        _("created at"), help_text=_("When the call was journaled, before its first attempt.")
    )
    updated_at = models.DateTimeField(
        _("updated at"), help_text=_("When the last attempt was started or answered.")
    )

    class Meta:
        db_table = "django_idempotency_outbound_call"
        verbose_name = _("outbound call")
        verbose_name_plural = _("outbound calls")
        constraints = [
            models.UniqueConstraint(fields=["key"], name="idempotency_outbound_key_uniq"),
        ]
        indexes = [
            models.Index(fields=["updated_at"], name="idempotency_outbound_upd_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.method} {self.target}"


class OutboxMessage(models.Model):
    """A Celery task call or an HTTP request, written in the transaction of the writes it
    follows from and delivered by the relay after that transaction commits.

    Its key goes with every delivery (the task's id, the request's Idempotency-Key): a relay
    killed after sending and before marking it sent sends it again with the same key, which the
    receiver (an `idempotent_task`, a guarded view, a provider) runs once.
    """

    class Kind(models.TextChoices):
        TASK = "task", _("Celery task")
        REQUEST = "request", _("HTTP request")

    class State(models.TextChoices):
        PENDING = "pending", _("pending")
        SENT = "sent", _("sent")
        DEAD = "dead", _("dead")

    id = models.BigAutoField(primary_key=True)
    key = models.CharField(
        _("key"),
        max_length=MAX_KEY_LENGTH,
        help_text=_(
            "Sent with every delivery: the Celery task's id, or the request's Idempotency-Key."
        ),
    )
    kind = models.CharField(_("kind"), max_length=16, choices=Kind.choices)
    destination = models.TextField(
        _("destination"), help_text=_("The task's name, or the URL the request is sent to.")
    )
    method = models.CharField(
        _("method"), max_length=16, blank=True, help_text=_("HTTP method; empty for a task.")
    )
    payload = models.JSONField(
        _("payload"),
        default=dict,
        blank=True,
        help_text=_(
            "A task's args, kwargs and sending options; a request's headers ([name, value])."
        ),
    )
    body = models.BinaryField(
        _("body"), null=True, blank=True, help_text=_("A request's body, byte for byte.")
    )
    aggregate = models.CharField(
        _("aggregate"),
        max_length=MAX_KEY_LENGTH,
        blank=True,
        help_text=_(
            "Messages of one aggregate are delivered one at a time, in the order they were"
            " written; empty for no order."
        ),
    )
    state = models.CharField(
        _("state"),
        max_length=16,
        choices=State.choices,
        default=State.PENDING,
        help_text=_(
            "pending: to be delivered; sent: accepted by the broker or answered by the receiver;"
            " dead: given up after the retry policy's attempts, or refused as wrong."
        ),
    )
    attempts = models.PositiveIntegerField(
        _("attempts"), default=0, help_text=_("Deliveries tried so far.")
    )
    last_error = models.CharField(
        _("last error"),
        max_length=255,
        blank=True,
        help_text=_("Why the last delivery failed (an answer's status, an exception)."),
    )
    available_at = models.DateTimeField(
        _("available at"), help_text=_("Not delivered before this (the retry policy's backoff).")
    )
    claim_token = models.CharField(
        _("claim token"),
        max_length=32,
        blank=True,
        help_text=_("The relay delivering it now; only that relay marks it sent."),
    )
    claimed_until = models.DateTimeField(
        _("claimed until"),
        null=True,
        blank=True,
        help_text=_("After this, another relay may deliver it (the first one stalled or died)."),
    )
    operation_id = models.CharField(
        _("operation"),
        max_length=26,
        blank=True,
        help_text=_("Identity of the operation that wrote it; empty outside one."),
    )
    created_at = models.DateTimeField(_("created at"), help_text=_("When it was written."))
    sent_at = models.DateTimeField(
        _("sent at"), null=True, blank=True, help_text=_("When it was delivered.")
    )

    class Meta:
        db_table = "django_idempotency_outbox"
        verbose_name = _("outbox message")
        verbose_name_plural = _("outbox messages")
        permissions = [("resend_outboxmessage", _("Can send outbox messages again"))]
        constraints = [
            models.UniqueConstraint(fields=["key"], name="idempotency_outbox_key_uniq"),
        ]
        indexes = [
            # The relay's scan: pending messages, oldest first.
            models.Index(
                fields=["available_at"],
                name="idempotency_outbox_due_idx",
                condition=models.Q(state="pending"),
            ),
            # "Is an earlier message of this aggregate still undelivered?"
            models.Index(fields=["aggregate", "id"], name="idempotency_outbox_agg_idx"),
            models.Index(fields=["sent_at"], name="idempotency_outbox_sent_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.destination}"


class RecoverableOperation(models.Model):
    """A `recover=True` function's or task's call, kept while it runs: the recovery sweep calls
    it again with these arguments if its lease ends without it completing (its worker died),
    and gives up (`failed`) after the sweep's attempts."""

    class Kind(models.TextChoices):
        FUNCTION = "function", _("function")
        TASK = "task", _("Celery task")

    class State(models.TextChoices):
        RUNNING = "running", _("running")
        FAILED = "failed", _("failed")

    id = models.BigAutoField(primary_key=True)
    namespace = models.CharField(_("namespace"), max_length=MAX_NAMESPACE_LENGTH)
    owner = models.CharField(_("owner"), max_length=MAX_OWNER_LENGTH, blank=True)
    key = models.CharField(_("key"), max_length=MAX_KEY_LENGTH)
    kind = models.CharField(_("kind"), max_length=16, choices=Kind.choices)
    target = models.CharField(
        _("target"),
        max_length=255,
        help_text=_("The function's dotted path, or the task's name, that the sweep calls."),
    )
    arguments = models.BinaryField(
        _("arguments"),
        help_text=_("The call's arguments as JSON, encrypted when encryption keys are set."),
    )
    state = models.CharField(
        _("state"), max_length=16, choices=State.choices, default=State.RUNNING
    )
    attempts = models.PositiveIntegerField(
        _("recoveries"), default=0, help_text=_("Times the sweep has called it again.")
    )
    last_error = models.CharField(_("last error"), max_length=255, blank=True)
    next_attempt_at = models.DateTimeField(
        _("next attempt at"), help_text=_("The sweep looks at it again from this moment on.")
    )
    created_at = models.DateTimeField(_("created at"))
    updated_at = models.DateTimeField(_("updated at"))

    class Meta:
        db_table = "django_idempotency_recoverable"
        verbose_name = _("recoverable operation")
        verbose_name_plural = _("recoverable operations")
        constraints = [
            models.UniqueConstraint(
                fields=["namespace", "owner", "key"], name="idempotency_recoverable_scope_uniq"
            ),
        ]
        indexes = [
            models.Index(fields=["state", "next_attempt_at"], name="idempotency_recover_due_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.target} {self.key}"
