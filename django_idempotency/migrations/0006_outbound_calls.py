"""The journal of outgoing calls (django_idempotency.outbound): one row per key sent downstream."""

from django.apps.registry import Apps
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor


def binary_key(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    """On MariaDB, keys compare byte for byte as elsewhere (see 0003): "abc" and "ABC" are two
    keys, two rows."""
    if schema_editor.connection.vendor != "mysql":
        return
    table = apps.get_model("django_idempotency", "OutboundCall")._meta.db_table
    quote = schema_editor.quote_name
    schema_editor.execute(
        f"ALTER TABLE {quote(table)} MODIFY {quote('key')} varchar(255)"
        " CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL"
    )


class Migration(migrations.Migration):
    dependencies = [
        ("django_idempotency", "0005_record_steps"),
    ]

    operations = [
        migrations.CreateModel(
            name="OutboundCall",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "key",
                    models.CharField(
                        help_text="The Idempotency-Key sent downstream, the same on every attempt.",
                        max_length=255,
                        verbose_name="key",
                    ),
                ),
                (
                    "namespace",
                    models.CharField(
                        blank=True,
                        help_text="Namespace of the operation that made the call; empty outside one.",
                        max_length=100,
                        verbose_name="operation namespace",
                    ),
                ),
                (
                    "owner",
                    models.CharField(
                        blank=True,
                        help_text="Owner of the operation that made the call; empty outside one.",
                        max_length=255,
                        verbose_name="operation owner",
                    ),
                ),
                (
                    "operation_key",
                    models.CharField(
                        blank=True,
                        help_text="Key of the operation (view, function or task) that made the call.",
                        max_length=255,
                        verbose_name="operation key",
                    ),
                ),
                (
                    "step",
                    models.CharField(
                        blank=True,
                        help_text="The step of the operation whose name the key was derived from.",
                        max_length=255,
                        verbose_name="step",
                    ),
                ),
                (
                    "method",
                    models.CharField(
                        help_text="HTTP method sent.", max_length=16, verbose_name="method"
                    ),
                ),
                (
                    "target",
                    models.TextField(
                        help_text="scheme://host/path called; never the query string, which may hold secrets.",
                        verbose_name="target",
                    ),
                ),
                (
                    "host",
                    models.CharField(
                        help_text="Host (and port) called, to filter by.",
                        max_length=255,
                        verbose_name="host",
                    ),
                ),
                (
                    "attempts",
                    models.PositiveIntegerField(
                        default=0,
                        help_text="Attempts sent so far, over every run.",
                        verbose_name="attempts",
                    ),
                ),
                (
                    "last_status",
                    models.PositiveSmallIntegerField(
                        blank=True,
                        help_text="Status of the last answer; empty when the last attempt got none.",
                        null=True,
                        verbose_name="last status",
                    ),
                ),
                (
                    "last_error",
                    models.CharField(
                        blank=True,
                        help_text="Why the last attempt got no answer (a timeout, a refused connection).",
                        max_length=255,
                        verbose_name="last error",
                    ),
                ),
                (
                    "outcome",
                    models.CharField(
                        choices=[
                            ("sending", "sending"),
                            ("confirmed", "confirmed"),
                            ("failed", "failed"),
                            ("ambiguous", "ambiguous"),
                        ],
                        help_text="sending: maybe sent, no final answer yet; confirmed: the downstream answered with its decision; failed: definitely not done; ambiguous: sent, answer lost.",
                        max_length=16,
                        verbose_name="outcome",
                    ),
                ),
                (
                    "replayed",
                    models.BooleanField(
                        default=False,
                        help_text="The last answer was a replay of an earlier one (Idempotent-Replayed).",
                        verbose_name="replayed",
                    ),
                ),
                (
                    "created_at",
                    models.DateTimeField(
                        help_text="When the call was journaled, before its first attempt.",
                        verbose_name="created at",
                    ),
                ),
                (
                    "updated_at",
                    models.DateTimeField(
                        help_text="When the last attempt was started or answered.",
                        verbose_name="updated at",
                    ),
                ),
            ],
            options={
                "verbose_name": "outbound call",
                "verbose_name_plural": "outbound calls",
                "db_table": "django_idempotency_outbound_call",
                "indexes": [
                    models.Index(fields=["updated_at"], name="idempotency_outbound_upd_idx")
                ],
                "constraints": [
                    models.UniqueConstraint(fields=("key",), name="idempotency_outbound_key_uniq")
                ],
            },
        ),
        # Reversed with the table, which goes with it.
        migrations.RunPython(binary_key, migrations.RunPython.noop, atomic=False, elidable=False),
    ]
