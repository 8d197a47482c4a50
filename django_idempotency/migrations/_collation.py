"""On MariaDB, make text columns compare byte for byte, as PostgreSQL and SQLite compare them.

Not a migration (the loader skips modules whose name starts with "_"): what 0008 and 0009 share.
"""

from django.db.backends.base.schema import BaseDatabaseSchemaEditor


def binary_columns(
    schema_editor: BaseDatabaseSchemaEditor, table: str, columns: dict[str, int]
) -> None:
    """ALTER the varchar `columns` (name: length) of `table` to utf8mb4_nopad_bin on MariaDB
    (see 0003: its default collations ignore case, accents and trailing spaces); elsewhere
    nothing."""
    if schema_editor.connection.vendor != "mysql":
        return
    quote = schema_editor.quote_name
    changes = ", ".join(
        f"MODIFY {quote(column)} varchar({length}) CHARACTER SET utf8mb4"
        " COLLATE utf8mb4_nopad_bin NOT NULL"
        for column, length in columns.items()
    )
    schema_editor.execute(f"ALTER TABLE {quote(table)} {changes}")
