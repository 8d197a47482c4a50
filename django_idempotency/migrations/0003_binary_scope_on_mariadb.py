"""On MariaDB, compare namespaces, owners and keys byte for byte, as PostgreSQL and SQLite do."""

from django.apps.registry import Apps
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

# MariaDB's default collations ignore case and trailing spaces: keys "abc", "ABC" and "abc "
# would be one key there, so one client's key would replay another request's response.
# utf8mb4_nopad_bin compares bytes and keeps trailing spaces. The model does not declare the
# collation (its name is MariaDB's alone), so the other databases are left as they are.
COLUMNS = {"namespace": 100, "owner": 255, "key": 255}


def binary_scope(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    _collate(apps, schema_editor, "CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin")


def default_scope(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    _collate(apps, schema_editor, "")


def _collate(apps: Apps, schema_editor: BaseDatabaseSchemaEditor, collation: str) -> None:
    if schema_editor.connection.vendor != "mysql":
        return
    table = apps.get_model("django_idempotency", "IdempotencyRecord")._meta.db_table
    quote = schema_editor.quote_name
    changes = ", ".join(
        f"MODIFY {quote(column)} varchar({length}) {collation} NOT NULL".replace("  ", " ")
        for column, length in COLUMNS.items()
    )
    schema_editor.execute(f"ALTER TABLE {quote(table)} {changes}")


class Migration(migrations.Migration):
    dependencies = [
        ("django_idempotency", "0002_response_reason"),
    ]

    operations = [migrations.RunPython(binary_scope, default_scope, atomic=False, elidable=False)]
