"""The outbound calls' journal in the admin: read-only, to tell "never sent" from "maybe sent"."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from django_idempotency.conf import conf
from django_idempotency.models import OutboundCall

if TYPE_CHECKING:
    OutboundCallAdminBase = admin.ModelAdmin[OutboundCall]
else:
    OutboundCallAdminBase = admin.ModelAdmin


# IDEMPOTENCY_ADMIN = False leaves it unregistered, as the records.
@(admin.register(OutboundCall) if conf.ADMIN else (lambda admin_class: admin_class))
class OutboundCallAdmin(OutboundCallAdminBase):
    list_display = [
        "key",
        "outcome",
        "method",
        "target",
        "last_status",
        "attempts",
        "replayed",
        "step",
        "updated_at",
    ]
    list_filter = ["outcome", "host", "replayed"]
    # Keys are pasted whole; targets are searched by their beginning (https://bank.example/…).
    search_fields = [
        "key__exact",
        "operation_key__exact",
        "operation_id__exact",
        "target__startswith",
    ]
    search_help_text = _(
        "Exact key, operation key or operation, or the beginning of a target"
        " (https://api.example.com/…)."
    )
    ordering = ["-id"]  # Newest first, by the primary key's index.
    show_full_result_count = False
    fieldsets = [
        (None, {"fields": ["key", "outcome", "replayed"]}),
        (_("Request"), {"fields": ["method", "target", "host", "step"]}),
        (_("Operation"), {"fields": ["namespace", "owner", "operation_key", "operation_id"]}),
        (_("Attempts"), {"fields": ["attempts", "last_status", "last_error"]}),
        (_("Timestamps"), {"fields": ["created_at", "updated_at"]}),
    ]
    readonly_fields = [
        "key",
        "outcome",
        "replayed",
        "method",
        "target",
        "host",
        "step",
        "namespace",
        "owner",
        "operation_key",
        "operation_id",
        "attempts",
        "last_status",
        "last_error",
        "created_at",
        "updated_at",
    ]

    # Rows are written by the calls they record. Viewing needs the view permission; deleting
    # rows an operator has dealt with, the delete permission.

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: OutboundCall | None = None) -> bool:
        return False
