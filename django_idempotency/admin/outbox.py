"""The outbox in the admin: read-only, with "Send again" for dead and sent messages."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth import get_permission_codename
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from django_idempotency.admin.bodies import _content_type, render_body
from django_idempotency.conf import conf
from django_idempotency.models import OutboxMessage
from django_idempotency.outbox.messages import outbox_alias
from django_idempotency.stores.database import clock_for

if TYPE_CHECKING:
    OutboxMessageAdminBase = admin.ModelAdmin[OutboxMessage]
else:
    OutboxMessageAdminBase = admin.ModelAdmin

State = OutboxMessage.State


class OutboxChangeList(ChangeList):
    def get_queryset(
        self, request: HttpRequest, exclude_parameters: list[str | None] | None = None
    ) -> QuerySet[Any]:
        # The list shows neither; a page of request bodies can be megabytes.
        return super().get_queryset(request, exclude_parameters).defer("body", "payload")


# IDEMPOTENCY_ADMIN = False leaves it unregistered, as the records.
@(admin.register(OutboxMessage) if conf.ADMIN else (lambda admin_class: admin_class))
class OutboxMessageAdmin(OutboxMessageAdminBase):
    list_display = [
        "id",
        "state",
        "kind",
        "destination",
        "method",
        "aggregate",
        "attempts",
        "last_error",
        "available_at",
        "created_at",
        "sent_at",
    ]
    list_filter = ["state", "kind"]
    # Keys, aggregates and operations are pasted whole; destinations are searched by their
    # beginning (https://api.example.com/…, or a task's module).
    search_fields = [
        "key__exact",
        "aggregate__exact",
        "operation_id__exact",
        "destination__startswith",
    ]
    search_help_text = _(
        "Exact key, aggregate or operation, or the beginning of a destination"
        " (https://api.example.com/…, billing.tasks.…)."
    )
    ordering = ["-id"]  # Newest first, by the primary key's index.
    show_full_result_count = False
    actions = ["resend"]
    fieldsets = [
        (None, {"fields": ["key", "kind", "state"]}),
        (_("Message"), {"fields": ["destination", "method", "payload", "body_shown"]}),
        (_("Order"), {"fields": ["aggregate", "operation_id"]}),
        (
            _("Delivery"),
            {"fields": ["attempts", "last_error", "available_at", "claim_token", "claimed_until"]},
        ),
        (_("Timestamps"), {"fields": ["created_at", "sent_at"]}),
    ]
    readonly_fields = [
        "key",
        "kind",
        "state",
        "destination",
        "method",
        "payload",
        "body_shown",
        "aggregate",
        "operation_id",
        "attempts",
        "last_error",
        "available_at",
        "claim_token",
        "claimed_until",
        "created_at",
        "sent_at",
    ]

    # Messages are written by the code that enqueues them and moved on by the relay. Viewing
    # needs the view permission; sending again, the resend permission; deleting (which lets
    # the aggregate a dead message holds back go on), the delete permission.

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: OutboxMessage | None = None) -> bool:
        return False

    def has_resend_permission(self, request: HttpRequest) -> bool:
        opts = self.opts
        codename = get_permission_codename("resend", opts)
        return request.user.has_perm(f"{opts.app_label}.{codename}")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return OutboxChangeList

    @admin.display(description=_("body"))
    def body_shown(self, obj: OutboxMessage) -> SafeString | None:
        if obj.body is None:
            return None  # A task: its arguments are in the payload.
        headers = (obj.payload or {}).get("headers", [])
        content_type = _content_type([(str(name), str(value)) for name, value in headers])
        return render_body(bytes(obj.body), content_type)

    @admin.action(permissions=["resend"], description=_("Send again"))
    def resend(self, request: HttpRequest, queryset: QuerySet[OutboxMessage]) -> None:
        selected = queryset.count()
        # Due now by the database's clock, the one the relay compares available_at with. The
        # same key goes with it: a receiver that runs each key once answers a sent message as
        # it did the first time.
        queued = queryset.filter(state__in=[State.DEAD, State.SENT]).update(
            state=State.PENDING,
            attempts=0,
            available_at=clock_for(outbox_alias()).now(),
            claim_token="",
            claimed_until=None,
            last_error="",
        )
        skipped = selected - queued
        said = [
            ngettext(
                "Queued %(count)d message to be sent again.",
                "Queued %(count)d messages to be sent again.",
                queued,
            )
            % {"count": queued}
        ]
        if skipped:
            said.append(
                ngettext(
                    "Skipped %(count)d pending message: it is already waiting to be sent.",
                    "Skipped %(count)d pending messages: they are already waiting to be sent.",
                    skipped,
                )
                % {"count": skipped}
            )
        self.message_user(request, " ".join(said), messages.SUCCESS if queued else messages.WARNING)
