"""The steps a lease-mode operation completed, kept on its record for a retry to resume from."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_idempotency", "0004_decrypted_response_permission"),
    ]

    operations = [
        migrations.AddField(
            model_name="idempotencyrecord",
            name="steps",
            field=models.JSONField(
                blank=True,
                help_text="Results of the steps a lease-mode operation completed (name: base64), which a retry of the same request skips.",
                null=True,
                verbose_name="steps",
            ),
        ),
    ]
