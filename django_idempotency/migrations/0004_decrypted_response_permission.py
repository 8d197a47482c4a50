"""The permission to read encrypted stored responses in the admin."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("django_idempotency", "0003_binary_scope_on_mariadb"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="idempotencyrecord",
            options={
                "permissions": [("view_decrypted_response", "Can view decrypted stored responses")],
                "verbose_name": "idempotency record",
                "verbose_name_plural": "idempotency records",
            },
        ),
    ]
