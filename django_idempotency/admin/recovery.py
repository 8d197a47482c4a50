"""The `recover=True` calls in the admin: read-only, with "Try again" for failed ones."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth import get_permission_codename
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from django_idempotency.admin.bodies import DECRYPT_PERMISSION, render_body
from django_idempotency.conf import conf
from django_idempotency.encryption import UnreadableResponse, unseal_step
from django_idempotency.models import RecoverableOperation
from django_idempotency.recovery import retry_failed

if TYPE_CHECKING:
    RecoverableOperationAdminBase = admin.ModelAdmin[RecoverableOperation]
else:
    RecoverableOperationAdminBase = admin.ModelAdmin

State = RecoverableOperation.State


class RecoveryChangeList(ChangeList):
    def get_queryset(
        self, request: HttpRequest, exclude_parameters: list[str | None] | None = None
    ) -> QuerySet[Any]:
        # The list never shows the arguments: neither loaded, nor readable there.
        return super().get_queryset(request, exclude_parameters).defer("arguments")


# IDEMPOTENCY_ADMIN = False leaves it unregistered, as the records.
@(admin.register(RecoverableOperation) if conf.ADMIN else (lambda admin_class: admin_class))
class RecoverableOperationAdmin(RecoverableOperationAdminBase):
    list_display = [
        "key",
        "namespace",
        "target",
        "kind",
        "state",
        "attempts",
        "last_error",
        "next_attempt_at",
        "created_at",
    ]
    list_filter = ["state", "kind"]
    # Keys and namespaces are pasted whole; targets are searched by their beginning (a module).
    search_fields = ["key__exact", "target__startswith", "namespace__exact"]
    search_help_text = _(
        "Exact key or namespace, or the beginning of a target (billing.tasks.…, shop.orders:…)."
    )
    ordering = ["-id"]  # Newest first, by the primary key's index.
    show_full_result_count = False
    actions = ["try_again"]
    fieldsets = [
        (None, {"fields": ["key", "namespace", "owner", "state"]}),
        (_("Call"), {"fields": ["kind", "target", "arguments_shown"]}),
        (_("Recovery"), {"fields": ["attempts", "last_error", "next_attempt_at"]}),
        (_("Timestamps"), {"fields": ["created_at", "updated_at"]}),
    ]
    readonly_fields = [
        "key",
        "namespace",
        "owner",
        "state",
        "kind",
        "target",
        "arguments_shown",
        "attempts",
        "last_error",
        "next_attempt_at",
        "created_at",
        "updated_at",
    ]

    # Calls are kept by the functions and tasks that run them and moved on by the sweep.
    # Viewing needs the view permission; trying a failed call again, the change permission
    # (Django's default one: the admin's form stays read-only); reading its arguments, the
    # permission that reads decrypted responses, since arguments hold what requests do.

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(
        self, request: HttpRequest, obj: RecoverableOperation | None = None
    ) -> bool:
        return False

    def has_retry_permission(self, request: HttpRequest) -> bool:
        opts = self.opts
        codename = get_permission_codename("change", opts)
        return request.user.has_perm(f"{opts.app_label}.{codename}")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return RecoveryChangeList

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:
            # The detail fields see the call, not the request: tell them who is looking.
            obj.may_decrypt = request.user.has_perm(DECRYPT_PERMISSION)  # type: ignore[attr-defined]
        return obj

    @admin.display(description=_("arguments"))
    def arguments_shown(self, obj: RecoverableOperation) -> SafeString:
        if getattr(obj, "may_decrypt", False) is not True:
            return _note(
                gettext(
                    "Hidden. Reading them needs the permission “Can view decrypted stored "
                    "responses”."
                )
            )
        try:
            arguments = unseal_step(bytes(obj.arguments), conf.ENCRYPTION_KEYS)
        except UnreadableResponse:
            return _note(
                gettext(
                    "Encrypted with a key no longer in IDEMPOTENCY_ENCRYPTION_KEYS: they cannot "
                    "be decrypted."
                )
            )
        return render_body(arguments, "application/json")

    @admin.action(permissions=["retry"], description=_("Try again"))
    def try_again(self, request: HttpRequest, queryset: QuerySet[RecoverableOperation]) -> None:
        selected = list(queryset.values_list("pk", flat=True))
        queued = retry_failed(selected)  # Failed ones only: a running call is the sweep's.
        skipped = len(selected) - queued
        said = [
            ngettext(
                "Queued %(count)d failed call for the next recovery sweep.",
                "Queued %(count)d failed calls for the next recovery sweep.",
                queued,
            )
            % {"count": queued}
        ]
        if skipped:
            said.append(
                ngettext(
                    "Skipped %(count)d running call: the sweep already tries it.",
                    "Skipped %(count)d running calls: the sweep already tries them.",
                    skipped,
                )
                % {"count": skipped}
            )
        self.message_user(request, " ".join(said), messages.SUCCESS if queued else messages.WARNING)


def _note(text: str) -> SafeString:
    return format_html('<p class="idempotency-encrypted">{}</p>', text)
