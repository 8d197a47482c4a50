"""Recovery without a client: the calls of recover=True functions and tasks, kept while they run."""

from django.apps.registry import Apps
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

from django_idempotency.migrations import _collation

# On MariaDB, scopes compare byte for byte, as the records' (see 0003): "Refund-1" and
# "refund-1" are two.
BINARY = {"namespace": 100, "owner": 255, "key": 255}


def binary_columns(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    table = apps.get_model("django_idempotency", "RecoverableOperation")._meta.db_table
    _collation.binary_columns(schema_editor, table, BINARY)


class Migration(migrations.Migration):
    dependencies = [
        ("django_idempotency", "0008_outbox"),
    ]

    operations = [
        migrations.CreateModel(
            name="RecoverableOperation",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("namespace", models.CharField(max_length=100, verbose_name="namespace")),
                ("owner", models.CharField(blank=True, max_length=255, verbose_name="owner")),
                ("key", models.CharField(max_length=255, verbose_name="key")),
                (
                    "kind",
                    models.CharField(
                        choices=[("function", "function"), ("task", "Celery task")],
                        max_length=16,
                        verbose_name="kind",
                    ),
                ),
                (
                    "target",
                    models.CharField(
                        help_text="The function's dotted path, or the task's name, that the sweep calls.",
                        max_length=255,
                        verbose_name="target",
                    ),
                ),
                (
                    "arguments",
                    models.BinaryField(
                        help_text="The call's arguments as JSON, encrypted when encryption keys are set.",
                        verbose_name="arguments",
                    ),
                ),
                (
                    "state",
                    models.CharField(
                        choices=[("running", "running"), ("failed", "failed")],
                        default="running",
                        max_length=16,
                        verbose_name="state",
                    ),
                ),
                (
                    "attempts",
                    models.PositiveIntegerField(
                        default=0,
                        help_text="Times the sweep has called it again.",
                        verbose_name="recoveries",
                    ),
                ),
                (
                    "last_error",
                    models.CharField(blank=True, max_length=255, verbose_name="last error"),
                ),
                (
                    "next_attempt_at",
                    models.DateTimeField(
                        help_text="The sweep looks at it again from this moment on.",
                        verbose_name="next attempt at",
                    ),
                ),
                ("created_at", models.DateTimeField(verbose_name="created at")),
                ("updated_at", models.DateTimeField(verbose_name="updated at")),
            ],
            options={
                "verbose_name": "recoverable operation",
                "verbose_name_plural": "recoverable operations",
                "db_table": "django_idempotency_recoverable",
                "indexes": [
                    models.Index(
                        fields=["state", "next_attempt_at"], name="idempotency_recover_due_idx"
                    )
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("namespace", "owner", "key"),
                        name="idempotency_recoverable_scope_uniq",
                    )
                ],
            },
        ),
        migrations.RunPython(
            binary_columns, migrations.RunPython.noop, atomic=False, elidable=False
        ),
    ]
