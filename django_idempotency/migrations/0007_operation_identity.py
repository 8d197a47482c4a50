"""Every record is an operation with an identity, from which its outbound keys (and journal) derive."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_idempotency", "0006_outbound_calls"),
    ]

    # Existing rows get none (a constant default, so no table rewrite on PostgreSQL or MariaDB):
    # their outbound keys derive as before, so an operation begun before the upgrade and
    # resumed after it sends the keys it sent.
    operations = [
        migrations.AddField(
            model_name="idempotencyrecord",
            name="operation_id",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                help_text="Identity (a ULID) of the operation this record is: new with every new record, kept by the same request's retry after a crash. Outbound keys derive from it.",
                max_length=26,
                verbose_name="operation",
            ),
        ),
        migrations.AddField(
            model_name="outboundcall",
            name="operation_id",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                help_text="Identity of the operation that made the call (its record's); empty outside one.",
                max_length=26,
                verbose_name="operation",
            ),
        ),
    ]
