"""The transactional outbox: messages written with the writes they follow from, relayed after."""

from django.apps.registry import Apps
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

from django_idempotency.migrations import _collation

# On MariaDB, keys and aggregates compare byte for byte, as the records' (see 0003): "Refund-1" and
# "refund-1" are two.
BINARY = {"key": 255, "aggregate": 255}


def binary_columns(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    table = apps.get_model("django_idempotency", "OutboxMessage")._meta.db_table
    _collation.binary_columns(schema_editor, table, BINARY)


class Migration(migrations.Migration):
    dependencies = [
        ("django_idempotency", "0007_operation_identity"),
    ]

    operations = [
        migrations.CreateModel(
            name="OutboxMessage",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "key",
                    models.CharField(
                        help_text="Sent with every delivery: the Celery task's id, or the request's Idempotency-Key.",
                        max_length=255,
                        verbose_name="key",
                    ),
                ),
                (
                    "kind",
                    models.CharField(
                        choices=[("task", "Celery task"), ("request", "HTTP request")],
                        max_length=16,
                        verbose_name="kind",
                    ),
                ),
                (
                    "destination",
                    models.TextField(
                        help_text="The task's name, or the URL the request is sent to.",
                        verbose_name="destination",
                    ),
                ),
                (
                    "method",
                    models.CharField(
                        blank=True,
                        help_text="HTTP method; empty for a task.",
                        max_length=16,
                        verbose_name="method",
                    ),
                ),
                (
                    "payload",
                    models.JSONField(
                        blank=True,
                        default=dict,
                        help_text="A task's args, kwargs and sending options; a request's headers ([name, value]).",
                        verbose_name="payload",
                    ),
                ),
                (
                    "body",
                    models.BinaryField(
                        blank=True,
                        help_text="A request's body, byte for byte.",
                        null=True,
                        verbose_name="body",
                    ),
                ),
                (
                    "aggregate",
                    models.CharField(
                        blank=True,
                        help_text="Messages of one aggregate are delivered one at a time, in the order they were written; empty for no order.",
                        max_length=255,
                        verbose_name="aggregate",
                    ),
                ),
                (
                    "state",
                    models.CharField(
                        choices=[("pending", "pending"), ("sent", "sent"), ("dead", "dead")],
                        default="pending",
                        help_text="pending: to be delivered; sent: accepted by the broker or answered by the receiver; dead: given up after the retry policy's attempts, or refused as wrong.",
                        max_length=16,
                        verbose_name="state",
                    ),
                ),
                (
                    "attempts",
                    models.PositiveIntegerField(
                        default=0, help_text="Deliveries tried so far.", verbose_name="attempts"
                    ),
                ),
                (
                    "last_error",
                    models.CharField(
                        blank=True,
                        help_text="Why the last delivery failed (an answer's status, an exception).",
                        max_length=255,
                        verbose_name="last error",
                    ),
                ),
                (
                    "available_at",
                    models.DateTimeField(
                        help_text="Not delivered before this (the retry policy's backoff).",
                        verbose_name="available at",
                    ),
                ),
                (
                    "claim_token",
                    models.CharField(
                        blank=True,
                        help_text="The relay delivering it now; only that relay marks it sent.",
                        max_length=32,
                        verbose_name="claim token",
                    ),
                ),
                (
                    "claimed_until",
                    models.DateTimeField(
                        blank=True,
                        help_text="After this, another relay may deliver it (the first one stalled or died).",
                        null=True,
                        verbose_name="claimed until",
                    ),
                ),
                (
                    "operation_id",
                    models.CharField(
                        blank=True,
                        help_text="Identity of the operation that wrote it; empty outside one.",
                        max_length=26,
                        verbose_name="operation",
                    ),
                ),
                (
                    "created_at",
                    models.DateTimeField(
                        help_text="When it was written.", verbose_name="created at"
                    ),
                ),
                (
                    "sent_at",
                    models.DateTimeField(
                        blank=True,
                        help_text="When it was delivered.",
                        null=True,
                        verbose_name="sent at",
                    ),
                ),
            ],
            options={
                "verbose_name": "outbox message",
                "verbose_name_plural": "outbox messages",
                "db_table": "django_idempotency_outbox",
                "permissions": [("resend_outboxmessage", "Can send outbox messages again")],
                "indexes": [
                    models.Index(
                        condition=models.Q(("state", "pending")),
                        fields=["available_at"],
                        name="idempotency_outbox_due_idx",
                    ),
                    models.Index(fields=["aggregate", "id"], name="idempotency_outbox_agg_idx"),
                    models.Index(fields=["sent_at"], name="idempotency_outbox_sent_idx"),
                ],
                "constraints": [
                    models.UniqueConstraint(fields=("key",), name="idempotency_outbox_key_uniq")
                ],
            },
        ),
        migrations.RunPython(
            binary_columns, migrations.RunPython.noop, atomic=False, elidable=False
        ),
    ]
