"""The records' ModelAdmin: read-only columns and fields, the tuned list, registration."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.db.models.expressions import Combinable
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from django_idempotency.admin.actions import (
    RecordActions,
    _forget_on_commit,
    delete_and_forget,
    interrupted_steps,
    purges_outside_the_requests_transaction,
)
from django_idempotency.admin.bodies import (
    DECRYPT_PERMISSION,
    _content_type,
    encrypted_note,
    is_encrypted,
    opened,
    render_body,
)
from django_idempotency.admin.changelist import (
    EstimatedCountPaginator,
    ExpiredFilter,
    NamespaceFilter,
    RecordChangeList,
    ResponseStatusClassFilter,
    calendar_hierarchy,
    records_elsewhere,
)
from django_idempotency.conf import conf
from django_idempotency.core.outcomes import Scope
from django_idempotency.models import IdempotencyRecord

if TYPE_CHECKING:
    from django.contrib.admin.options import _FieldsetSpec

    RecordAdminBase = admin.ModelAdmin[IdempotencyRecord]
else:
    RecordAdminBase = admin.ModelAdmin

logger = logging.getLogger("django_idempotency")


# IDEMPOTENCY_ADMIN = False leaves the model unregistered; read when the admin autodiscovers.
@(admin.register(IdempotencyRecord) if conf.ADMIN else (lambda admin_class: admin_class))
class IdempotencyRecordAdmin(RecordActions):
    list_display = [
        "key",
        "namespace",
        "owner",
        "status",
        "response_status",
        "request_line",
        "created_at",
        "expires_at",
        "expired",
    ]
    list_display_links = ["key"]
    list_filter = ["status", NamespaceFilter, ResponseStatusClassFilter, ExpiredFilter]
    # Exact and prefix lookups compare the column as stored, so an index on it (a project may
    # add one, see docs/admin.md) can serve them; "=key" (iexact) and plain "path" (icontains)
    # wrap every row in UPPER() / LIKE '%…%', which no plain index serves. Keys and owners are
    # pasted whole; paths are searched by their beginning.
    search_fields = ["key__exact", "owner__exact", "path__startswith"]
    search_help_text = _("Exact key or owner, or the beginning of a path (/v1/payments/…).")
    date_hierarchy = "created_at"
    # Newest first by primary key, an index scan; created_at has no index of its own.
    ordering = ["-id"]
    # Sorting by a column without an index sorts the whole table for each page.
    sortable_by = ["expires_at"]
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # Facet counts are one COUNT per filter choice.
    paginator = EstimatedCountPaginator
    actions = [
        "purge_selected",
        "purge_expired",
        "release_abandoned",
        "step_happened",
        "step_did_not_happen",
    ]
    change_list_template = "django_idempotency/admin/change_list.html"
    change_form_template = "django_idempotency/admin/change_form.html"
    fieldsets = [
        (None, {"fields": ["key", "namespace", "owner", "status", "expired", "operation_id"]}),
        (_("Request"), {"fields": ["method", "path", "fingerprint"]}),
        (_("Response"), {"fields": ["response_status", "headers_table", "body_preview"]}),
        (_("Lease"), {"fields": ["lease_holder", "lease_expires_at"]}),
        (_("Timestamps"), {"fields": ["created_at", "completed_at", "expires_at"]}),
    ]
    readonly_fields = [
        "key",
        "namespace",
        "owner",
        "status",
        "expired",
        "operation_id",
        "method",
        "path",
        "fingerprint",
        "response_status",
        "headers_table",
        "body_preview",
        "lease_holder",
        "lease_expires_at",
        "created_at",
        "completed_at",
        "expires_at",
        "interrupted_steps_shown",
    ]
    # Actions that act on the whole table: they run without a selection, and ignore one.
    table_actions = frozenset({"purge_expired", "release_abandoned"})

    # Permissions: records are written only by the requests they protect. Viewing needs the
    # view permission; deleting (the actions, the delete page) the delete permission; resolving
    # an interrupted step, the change permission (see RecordActions).

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(
        self, request: HttpRequest, obj: IdempotencyRecord | None = None
    ) -> bool:
        return False

    def get_ordering(self, request: HttpRequest) -> list[str | Combinable]:
        # Walking the primary key index newest first fills a page at once when most records
        # match, but reads the whole table when few do (few in progress, few expired). With
        # those filters on, follow the index that holds the matching records instead.
        if request.GET.get("status__exact") == IdempotencyRecord.Status.IN_PROGRESS:
            return ["lease_expires_at"]  # The partial index on in-progress leases; abandoned first.
        if ExpiredFilter.parameter_name in request.GET:
            return ["-expires_at"]
        return list(self.ordering)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return RecordChangeList

    def get_fieldsets(
        self, request: HttpRequest, obj: IdempotencyRecord | None = None
    ) -> _FieldsetSpec:
        fieldsets = list(super().get_fieldsets(request, obj))
        if obj is not None and interrupted_steps(obj):
            # Only where there is one: what an operator must resolve before the retry goes on.
            fieldsets.insert(1, (_("Steps"), {"fields": ["interrupted_steps_shown"]}))
        return fieldsets

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        # purge_selected replaces delete_selected: it also drops the cached copies. Django 6.1
        # passes action_location; Django 5.2 knows no such argument.
        location = {} if action_location is None else {"action_location": action_location}
        actions = super().get_actions(request, **location)
        actions.pop("delete_selected", None)
        return actions

    @purges_outside_the_requests_transaction  # The actions run from this view.
    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if self._table_action_without_selection(request):
            # Django runs an action only on a selection. A table action ignores it, so stand in
            # "all rows" rather than make the user tick a box that changes nothing.
            post = request.POST.copy()
            post.setlist(helpers.ACTION_CHECKBOX_NAME, ["all"])
            post["select_across"] = "1"
            request.POST = post  # type: ignore[assignment]
        response = super().changelist_view(request, extra_context)
        context = getattr(response, "context_data", None)
        if context is not None and "cl" in context:
            context["calendar_hierarchy"] = calendar_hierarchy(context["cl"])
            context["records_elsewhere"] = records_elsewhere()
        return response

    def _table_action_without_selection(self, request: HttpRequest) -> bool:
        if request.method != "POST" or request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
            return False
        try:
            index = int(request.POST.get("index", 0))
            action = request.POST.getlist("action")[index]
        except (ValueError, IndexError):
            return False
        return action in self.table_actions

    def delete_model(self, request: HttpRequest, obj: IdempotencyRecord) -> None:
        scope = Scope(obj.namespace, obj.owner, obj.key)
        super().delete_model(request, obj)
        _forget_on_commit([scope], obj._state.db)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        delete_and_forget(queryset)

    # Columns and detail fields.

    @admin.display(description=_("request"))
    def request_line(self, obj: IdempotencyRecord) -> str:
        return Truncator(f"{obj.method} {obj.path}").chars(60)

    @admin.display(description=_("expired"), boolean=True)
    def expired(self, obj: IdempotencyRecord) -> bool:
        return obj.expires_at <= timezone.now()

    @admin.display(description=_("lease holder"))
    def lease_holder(self, obj: IdempotencyRecord) -> str:
        return obj.lease_token

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:
            # The detail fields see the record, not the request: tell them who is looking.
            obj.may_decrypt = request.user.has_perm(DECRYPT_PERMISSION)  # type: ignore[attr-defined]
        return obj

    @admin.display(description=_("interrupted steps"))
    def interrupted_steps_shown(self, obj: IdempotencyRecord) -> str:
        return ", ".join(interrupted_steps(obj))

    @admin.display(description=_("response headers"))
    def headers_table(self, obj: IdempotencyRecord) -> SafeString | None:
        response = opened(obj)
        if response is None:
            return encrypted_note(obj)
        headers = response.headers
        if not headers:
            return None
        rows = format_html_join("", "<tr><td>{}</td><td>{}</td></tr>", headers)
        return format_html(
            '<table class="idempotency-headers"><thead><tr><th>{}</th><th>{}</th></tr></thead>'
            "<tbody>{}</tbody></table>",
            gettext("Name"),
            gettext("Value"),
            rows,
        )

    @admin.display(description=_("response body"))
    def body_preview(self, obj: IdempotencyRecord) -> SafeString | None:
        if obj.response_body is None:
            return None
        response = opened(obj)
        if response is None:
            return encrypted_note(obj)
        body = render_body(response.body, _content_type(response.headers))
        if is_encrypted(obj):
            return format_html("{}{}", encrypted_note(obj), body)
        return body
