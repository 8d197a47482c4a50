"""Django admin for idempotency records: browse, inspect and purge; read-only otherwise.

The list (`changelist`), the detail page's body display (`bodies`) and the actions (`actions`)
each have their room; `records` puts them together in the registered ModelAdmin. `outbound`
shows the journal of outbound calls, `outbox` the outbox's messages (and sends them again),
`recovery` the `recover=True` calls kept for the recovery sweep (and tries failed ones again).
"""

from django.contrib import admin

from django_idempotency.admin.actions import RecordActions, delete_and_forget
from django_idempotency.admin.bodies import (
    BODY_PREVIEW_CHARS,
    PRETTY_PRINT_MAX_BYTES,
    render_body,
)
from django_idempotency.admin.changelist import (
    EstimatedCountPaginator,
    NamespaceFilter,
    calendar_hierarchy,
    distinct_namespaces,
    records_elsewhere,
)
from django_idempotency.admin.outbound import OutboundCallAdmin
from django_idempotency.admin.outbox import OutboxMessageAdmin
from django_idempotency.admin.records import IdempotencyRecordAdmin
from django_idempotency.admin.recovery import RecoverableOperationAdmin

__all__ = [
    "BODY_PREVIEW_CHARS",
    "PRETTY_PRINT_MAX_BYTES",
    "EstimatedCountPaginator",
    "IdempotencyRecordAdmin",
    "NamespaceFilter",
    "OutboundCallAdmin",
    "OutboxMessageAdmin",
    "RecordActions",
    "RecoverableOperationAdmin",
    "admin",
    "calendar_hierarchy",
    "delete_and_forget",
    "distinct_namespaces",
    "records_elsewhere",
    "render_body",
]
