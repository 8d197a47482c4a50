"""Django admin for idempotency records: browse, inspect and purge; read-only otherwise."""

from __future__ import annotations

import calendar
import functools
import json
import logging
from collections.abc import Callable
from datetime import date, datetime
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db import InterfaceError, OperationalError, connections, transaction
from django.db.models import QuerySet
from django.db.models.expressions import Combinable
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import formats, timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import Truncator, capfirst
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from django_idempotency.conf import conf, load_callable
from django_idempotency.core.fingerprint import is_json_media_type
from django_idempotency.core.outcomes import Scope
from django_idempotency.models import IdempotencyRecord, abandoned
from django_idempotency.stores import StoreUnavailable, get_store
from django_idempotency.stores.database import DatabaseStore
from django_idempotency.stores.redis import RedisStore

if TYPE_CHECKING:
    RecordAdminBase = admin.ModelAdmin[IdempotencyRecord]
else:
    RecordAdminBase = admin.ModelAdmin

logger = logging.getLogger("django_idempotency")

BODY_PREVIEW_CHARS = 10 * 1024
# Larger bodies are previewed raw: parsing megabytes of JSON only to show its first 10 kB would
# make the page slow for nothing.
PRETTY_PRINT_MAX_BYTES = 1024 * 1024
DELETE_BATCH_SIZE = 1000
CONFIRMATION_SAMPLE = 10
_UNREACHABLE = (StoreUnavailable, OperationalError, InterfaceError)

_Action = Callable[
    ["IdempotencyRecordAdmin", HttpRequest, QuerySet[IdempotencyRecord]], HttpResponse | None
]


def reports_a_lost_database(stopped: Callable[[], str]) -> Callable[[_Action], _Action]:
    """Turn a database lost during an action into an error message and a redirect back.

    An outage is not a bug: the user gets what happened and what to do, not a 500. `stopped`
    gives the message, with ``%(error)s`` for the database's own words.
    """

    def decorate(action: _Action) -> _Action:
        @functools.wraps(action)
        def run(
            self: IdempotencyRecordAdmin,
            request: HttpRequest,
            queryset: QuerySet[IdempotencyRecord],
        ) -> HttpResponse | None:
            try:
                return action(self, request, queryset)
            except _UNREACHABLE as exc:
                logger.warning("Admin action %s stopped: %s", action.__name__, exc)
                error = " ".join(str(exc).split()).rstrip(".") or type(exc).__name__
                self.message_user(request, stopped() % {"error": error}, messages.ERROR)
                return None  # Django's admin then redirects back to the list, filters kept.

        return run

    return decorate


def _purge_stopped() -> str:
    return gettext(
        "The purge stopped: the database holding idempotency records cannot be reached "
        "(%(error)s). Try again when it is back; records already purged stay purged."
    )


def _release_stopped() -> str:
    return gettext(
        "The release stopped: the database holding idempotency records cannot be reached "
        "(%(error)s). Try again when it is back; records already released stay released."
    )


class ResponseStatusClassFilter(admin.SimpleListFilter):
    title = _("response status class")
    parameter_name = "response_class"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, str]]:
        return [(f"{digit}xx", f"{digit}xx") for digit in "2345"]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value not in {f"{digit}xx" for digit in "2345"}:
            return queryset
        low = int(value[0]) * 100
        return queryset.filter(response_status__range=(low, low + 99))


class ExpiredFilter(admin.SimpleListFilter):
    title = _("expired")
    parameter_name = "expired"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, str]]:
        return [("yes", gettext("Yes")), ("no", gettext("No"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        # Same boundary as the store: a record expiring exactly now is already expired.
        if self.value() == "yes":
            return queryset.filter(expires_at__lte=timezone.now())
        if self.value() == "no":
            return queryset.filter(expires_at__gt=timezone.now())
        return queryset


class NamespaceFilter(admin.SimpleListFilter):
    """Namespaces found by skipping through the scope index, not by a DISTINCT over every row."""

    title = _("namespace")
    parameter_name = "namespace"
    max_choices = 100

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, str]]:
        db = model_admin.get_queryset(request).db
        return [(name, name) for name in distinct_namespaces(db, self.max_choices)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset if value is None else queryset.filter(namespace=value)


def distinct_namespaces(db: str, limit: int) -> list[str]:
    """The first `limit` namespaces in order, one index probe each (a "loose index scan").

    The unique (namespace, owner, key) index leads with namespace, so each step jumps straight
    to the next namespace: a few dozen probes instead of reading millions of rows.
    """
    connection = connections[db]
    table = connection.ops.quote_name(IdempotencyRecord._meta.db_table)
    column = connection.ops.quote_name("namespace")
    sql = (
        f"WITH RECURSIVE names(name) AS ("
        f"SELECT * FROM (SELECT {column} FROM {table} ORDER BY {column} LIMIT 1) AS first_name "
        f"UNION ALL SELECT (SELECT {column} FROM {table} WHERE {column} > names.name "
        f"ORDER BY {column} LIMIT 1) FROM names WHERE names.name IS NOT NULL"
        f") SELECT name FROM names WHERE name IS NOT NULL LIMIT %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [limit])
        return [row[0] for row in cursor.fetchall()]


class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]
    """Counts exactly, except where PostgreSQL's planner expects a large result.

    An exact COUNT(*) reads every matching row; on a table of millions that is most of the page's
    time, on every page view. Above `estimate_from` rows the planner's estimate (from the
    statistics ANALYZE keeps) stands in: the page links are then approximate.
    """

    estimate_from = 100_000
    estimated = False

    @cached_property
    def count(self) -> int:
        estimate = self._planner_estimate()
        if estimate is not None and estimate >= self.estimate_from:
            self.estimated = True
            return estimate
        return super().count

    def _planner_estimate(self) -> int | None:
        queryset = self.object_list
        if not isinstance(queryset, QuerySet):
            return None
        connection = connections[queryset.db]
        if connection.vendor != "postgresql":
            return None
        sql, params = queryset.order_by().values("pk").query.sql_with_params()
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
            (plan,) = cursor.fetchone()
        return int(plan[0]["Plan"]["Plan Rows"])


class RecordChangeList(ChangeList):
    def get_queryset(
        self, request: HttpRequest, exclude_parameters: list[str | None] | None = None
    ) -> QuerySet[Any]:
        # The list never shows bodies or headers; 100 stored bodies can be megabytes.
        queryset = super().get_queryset(request, exclude_parameters)
        return queryset.defer("response_body", "response_headers")


# IDEMPOTENCY_ADMIN = False leaves the model unregistered; read when the admin autodiscovers.
@(admin.register(IdempotencyRecord) if conf.ADMIN else (lambda admin_class: admin_class))
class IdempotencyRecordAdmin(RecordAdminBase):
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
    actions = ["purge_selected", "purge_expired", "release_stuck"]
    change_list_template = "django_idempotency/admin/change_list.html"
    change_form_template = "django_idempotency/admin/change_form.html"
    fieldsets = [
        (None, {"fields": ["key", "namespace", "owner", "status", "expired"]}),
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
    ]
    # Actions that act on the whole table: they run without a selection, and ignore one.
    table_actions = frozenset({"purge_expired", "release_stuck"})

    # Permissions: records are written only by the requests they protect. Viewing needs the
    # view permission; deleting (the actions, the delete page) the delete permission.

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

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        # purge_selected replaces delete_selected: it also drops the cached copies. Django 6.1
        # passes action_location; Django 5.2 knows no such argument.
        location = {} if action_location is None else {"action_location": action_location}
        actions = super().get_actions(request, **location)
        actions.pop("delete_selected", None)
        return actions

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

    @admin.display(description=_("response headers"))
    def headers_table(self, obj: IdempotencyRecord) -> SafeString | None:
        headers = _header_pairs(obj)
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
        return render_body(bytes(obj.response_body), _content_type(obj))

    # Actions. Each asks for confirmation first, then reports what it did.

    @admin.action(permissions=["delete"], description=_("Purge selected idempotency records"))
    @reports_a_lost_database(_purge_stopped)
    def purge_selected(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyRecord]
    ) -> HttpResponse | None:
        if not request.POST.get("post"):
            count = queryset.count()
            sample = list(queryset.values_list("key", flat=True)[:CONFIRMATION_SAMPLE])
            question = ngettext(
                "Purge %(count)d idempotency record? Its key starts a new request the next "
                "time it is sent.",
                "Purge %(count)d idempotency records? Their keys start new requests the next "
                "time they are sent.",
                count,
            ) % {"count": count}
            return self._confirm(request, "purge_selected", question, sample, count)
        deleted = delete_and_forget(queryset)
        logger.info("%s purged %d selected idempotency records in the admin", request.user, deleted)
        self.message_user(
            request,
            ngettext(
                "Purged %(count)d idempotency record.",
                "Purged %(count)d idempotency records.",
                deleted,
            )
            % {"count": deleted},
            messages.SUCCESS,
        )
        return None

    @admin.action(permissions=["delete"], description=_("Purge all expired idempotency records"))
    @reports_a_lost_database(_purge_stopped)
    def purge_expired(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyRecord]
    ) -> HttpResponse | None:
        store = get_store()
        if not request.POST.get("post"):
            preview = store.purge(timezone.now(), dry_run=True)
            # Whole sentences, one count each, so that every language can word them.
            question = " ".join(
                [
                    ngettext(
                        "%(count)d expired record will be purged.",
                        "%(count)d expired records will be purged.",
                        preview.expired,
                    )
                    % {"count": preview.expired},
                    ngettext(
                        "%(count)d abandoned in-progress record (its lease ran out) will be "
                        "purged.",
                        "%(count)d abandoned in-progress records (their leases ran out) will be "
                        "purged.",
                        preview.abandoned,
                    )
                    % {"count": preview.abandoned},
                ]
            )
            return self._confirm(request, "purge_expired", question, [], preview.total)
        result = store.purge(timezone.now())
        logger.info(
            "%s purged %d expired and %d abandoned idempotency records in the admin",
            request.user,
            result.expired,
            result.abandoned,
        )
        self.message_user(
            request,
            " ".join(
                [
                    ngettext(
                        "Purged %(count)d expired record.",
                        "Purged %(count)d expired records.",
                        result.expired,
                    )
                    % {"count": result.expired},
                    ngettext(
                        "Purged %(count)d abandoned in-progress record.",
                        "Purged %(count)d abandoned in-progress records.",
                        result.abandoned,
                    )
                    % {"count": result.abandoned},
                ]
            ),
            messages.SUCCESS,
        )
        return None

    @admin.action(permissions=["delete"], description=_("Release abandoned idempotency claims"))
    @reports_a_lost_database(_release_stopped)
    def release_stuck(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyRecord]
    ) -> HttpResponse | None:
        stuck = _stuck(timezone.now())
        if not request.POST.get("post"):
            count = stuck.count()
            sample = list(stuck.order_by("-id").values_list("key", flat=True)[:CONFIRMATION_SAMPLE])
            question = ngettext(
                "Release %(count)d in-progress record whose lease ran out? Its key starts a "
                "new request the next time it is sent.",
                "Release %(count)d in-progress records whose leases ran out? Their keys start "
                "new requests the next time they are sent.",
                count,
            ) % {"count": count}
            return self._confirm(request, "release_stuck", question, sample, count)
        released = delete_and_forget(stuck)
        logger.info(
            "%s released %d abandoned idempotency claims in the admin", request.user, released
        )
        self.message_user(
            request,
            ngettext(
                "Released %(count)d abandoned claim.",
                "Released %(count)d abandoned claims.",
                released,
            )
            % {"count": released},
            messages.SUCCESS,
        )
        return None

    def _confirm(
        self, request: HttpRequest, action: str, question: str, sample: list[str], count: int
    ) -> TemplateResponse:
        """The intermediate page: what is about to go, and confirm or cancel."""
        opts = self.model._meta
        description = getattr(getattr(self, action), "short_description", action)
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("Are you sure?"),
            "subtitle": description,
            "opts": opts,
            "action": action,
            "action_description": description,
            "question": question,
            "count": count,
            "sample": sample,
            "more": max(0, count - len(sample)) if sample else 0,
            "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across") == "1",
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "cancel_url": request.get_full_path(),
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "django_idempotency/admin/confirm_action.html", context)


def records_elsewhere() -> str | None:
    """Where the configured store keeps its records, when that is not this table."""
    try:
        store_class = load_callable(conf.STORE, "IDEMPOTENCY_STORE")
    except Exception:  # A misconfigured store: `manage.py check` reports it.
        return None
    if not isinstance(store_class, type) or issubclass(store_class, DatabaseStore):
        return None
    if issubclass(store_class, RedisStore):
        return gettext(
            "The Redis store keeps the records in Redis (cache alias “%(alias)s”), where they"
            " expire by Redis TTL: this list shows none of them."
        ) % {"alias": conf.REDIS_CACHE}
    return gettext(
        "The configured store (%(store)s) keeps its records outside this table: this list shows"
        " none of them."
    ) % {"store": conf.STORE}


def calendar_hierarchy(cl: ChangeList) -> dict[str, Any]:
    """Django's date hierarchy, drawn from the calendar instead of a scan of the table.

    Django's asks the database for MIN/MAX(created_at) and then for the DISTINCT days or months
    that hold records: each reads every row, seconds per page view on millions of records. Here
    the range comes from the oldest and newest records by primary key (two index probes) and the
    links are every year, month or day in it. The range is approximate, since a key taken over
    keeps its id but gets a new created_at; a link may lead to a day without records.
    """
    field = cl.date_hierarchy
    year_field, month_field, day_field = (f"{field}__{part}" for part in ("year", "month", "day"))
    generic = f"{field}__"
    label = getattr(cl.opts.get_field(field), "verbose_name", field)
    oldest, newest = (
        cl.root_queryset.order_by(order).values_list(field, flat=True).first()
        for order in ("pk", "-pk")
    )
    if oldest is None or newest is None:
        return {"show": False}
    first, last = sorted([_local_date(oldest), _local_date(newest)])

    def link(filters: dict[str, Any]) -> str:
        return cl.get_query_string(filters, [generic])

    try:
        year = int(cl.params[year_field]) if year_field in cl.params else None
        month = int(cl.params[month_field]) if month_field in cl.params else None
        day = int(cl.params[day_field]) if day_field in cl.params else None
        selected = date(year or 1, month or 1, day or 1)
    except (TypeError, ValueError):
        return {"show": False}  # Django's own filter already rejected these parameters.
    if year is None and first.year == last.year:
        year = first.year
        if first.month == last.month:
            month = first.month
        selected = date(year, month or 1, 1)
    base = {"show": True, "field_name": label}
    if year is not None and month is not None and day is not None:
        return {
            **base,
            "back": {
                "link": link({year_field: year, month_field: month}),
                "title": capfirst(formats.date_format(selected, "YEAR_MONTH_FORMAT")),
            },
            "choices": [{"title": capfirst(formats.date_format(selected, "MONTH_DAY_FORMAT"))}],
        }
    if year is not None and month is not None:
        days_in_month = calendar.monthrange(year, month)[1]
        month_days = [date(year, month, number) for number in range(1, days_in_month + 1)]
        return {
            **base,
            "back": {"link": link({year_field: year}), "title": str(year)},
            "choices": [
                {
                    "link": link({year_field: year, month_field: month, day_field: day.day}),
                    "title": capfirst(formats.date_format(day, "MONTH_DAY_FORMAT")),
                }
                for day in _within(month_days, first, last)
            ],
        }
    if year is not None:
        months = [date(year, number, 1) for number in range(1, 13)]
        first_month, last_month = first.replace(day=1), last.replace(day=1)
        return {
            **base,
            "back": {"link": link({}), "title": gettext("All dates")},
            "choices": [
                {
                    "link": link({year_field: year, month_field: month_start.month}),
                    "title": capfirst(formats.date_format(month_start, "YEAR_MONTH_FORMAT")),
                }
                for month_start in _within(months, first_month, last_month)
            ],
        }
    return {
        **base,
        "back": None,
        "choices": [
            {"link": link({year_field: str(number)}), "title": str(number)}
            for number in range(first.year, last.year + 1)
        ],
    }


def _local_date(value: datetime) -> date:
    return (timezone.localtime(value) if timezone.is_aware(value) else value).date()


def _within(dates: list[date], first: date, last: date) -> list[date]:
    """The dates inside [first, last]; all of them if none is (a period outside the range)."""
    inside = [day for day in dates if first <= day <= last]
    return inside or dates


def delete_and_forget(records: QuerySet[Any], batch_size: int | None = None) -> int:
    """Delete `records` in short batches and drop their cached copies; return how many went.

    Each batch re-applies the queryset's conditions in its DELETE, so a record that a new
    request took over in the meantime (its lease renewed, its expiry moved) is left alone.
    """
    batch_size = batch_size or DELETE_BATCH_SIZE
    deleted = 0
    records = records.order_by()
    while True:
        with transaction.atomic(using=records.db):
            batch = list(records.values_list("pk", "namespace", "owner", "key")[:batch_size])
            if not batch:
                return deleted
            count, _ = records.filter(pk__in=[row[0] for row in batch]).delete()
            _forget_on_commit([Scope(*row[1:]) for row in batch], records.db)
        deleted += count
        if len(batch) < batch_size:
            return deleted


def _forget_on_commit(scopes: list[Scope], using: str | None) -> None:
    # Not before the commit: a replay in between would find the record and cache it again.
    transaction.on_commit(partial(get_store().forget, scopes), using=using)


def _stuck(now: datetime) -> QuerySet[IdempotencyRecord]:
    """Abandoned records: in progress, their lease run out, the request holding them gone."""
    return IdempotencyRecord.objects.filter(abandoned(now))


def _header_pairs(obj: IdempotencyRecord) -> list[tuple[str, str]]:
    headers = obj.response_headers if isinstance(obj.response_headers, list) else []
    return [(str(pair[0]), str(pair[1])) for pair in headers if len(pair) == 2]


def _content_type(obj: IdempotencyRecord) -> str:
    for name, value in _header_pairs(obj):
        if name.lower() == "content-type":
            return value
    return ""


def _is_text(media_type: str) -> bool:
    return (
        media_type.startswith("text/")
        or media_type.endswith("+xml")
        or media_type
        in {"application/xml", "application/javascript", "application/x-www-form-urlencoded"}
    )


def render_body(body: bytes, content_type: str) -> SafeString:
    """A stored body for people: JSON indented, text as is, binary as its size and type.

    Everything shown is escaped; a long body is cut to its first 10 kB, with its full size.
    """
    size = len(body)
    media_type, _sep, parameters = content_type.partition(";")
    media_type = media_type.strip().lower()
    text = _decoded(body, media_type, _charset(parameters))
    if text is None:
        return format_html(
            '<p class="idempotency-binary">{}</p>',
            ngettext("%(count)s byte of %(type)s", "%(count)s bytes of %(type)s", size)
            % {
                "count": formats.number_format(size, force_grouping=True),
                "type": media_type or gettext("unknown type"),
            },
        )
    if not text:
        return format_html('<p class="idempotency-empty">{}</p>', gettext("Empty body."))
    if len(text) <= BODY_PREVIEW_CHARS:
        return format_html('<pre class="idempotency-body">{}</pre>', text)
    note = ngettext(
        "Truncated to its first %(shown)s characters; the full body is %(count)s byte.",
        "Truncated to its first %(shown)s characters; the full body is %(count)s bytes.",
        size,
    ) % {
        "shown": formats.number_format(BODY_PREVIEW_CHARS, force_grouping=True),
        "count": formats.number_format(size, force_grouping=True),
    }
    return format_html(
        '<pre class="idempotency-body">{}…</pre><p class="help idempotency-truncated">{}</p>',
        text[:BODY_PREVIEW_CHARS],
        note,
    )


def _charset(parameters: str) -> str:
    for parameter in parameters.split(";"):
        name, _sep, value = parameter.partition("=")
        if name.strip().lower() == "charset" and value.strip():
            return value.strip().strip('"')
    return "utf-8"


def _decoded(body: bytes, media_type: str, charset: str) -> str | None:
    """The body as text to show (JSON indented), or None if it is binary."""
    looks_like_json = is_json_media_type(media_type) or (
        not media_type and body.lstrip()[:1] in (b"{", b"[")
    )
    if looks_like_json and len(body) <= PRETTY_PRINT_MAX_BYTES:
        try:
            return json.dumps(json.loads(body), indent=2, ensure_ascii=False)
        except ValueError:
            pass  # Not valid JSON after all: show it as text, or as binary.
        except RecursionError:
            pass  # Nested too deep to parse or indent within the stack: show it as stored.
    if media_type and not (looks_like_json or _is_text(media_type)):
        return None
    # A large body is only previewed, so decode just enough of it (4 bytes per character at most).
    head = body if len(body) <= PRETTY_PRINT_MAX_BYTES else body[: BODY_PREVIEW_CHARS * 4 + 4]
    if not media_type and b"\x00" in head[:8192]:
        return None  # Untyped, with NUL bytes: binary, as git decides.
    try:
        return head.decode(charset)
    except LookupError:
        return None  # An unknown charset: show the size rather than guess.
    except UnicodeDecodeError as exc:
        if head is not body and exc.start >= len(head) - 4:
            return head[: exc.start].decode(charset)  # The cut fell inside a character.
        return None
