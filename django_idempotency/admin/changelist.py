"""The records' list: filters, a namespace filter by loose index scan, counts, calendar."""

from __future__ import annotations

import calendar
import logging
from datetime import date, datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import formats, timezone
from django.utils.text import capfirst
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from django_idempotency.conf import conf, load_callable
from django_idempotency.models import IdempotencyRecord
from django_idempotency.stores.database import DatabaseStore
from django_idempotency.stores.redis import RedisStore

if TYPE_CHECKING:
    RecordAdminBase = admin.ModelAdmin[IdempotencyRecord]
else:
    RecordAdminBase = admin.ModelAdmin

logger = logging.getLogger("django_idempotency")


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
    oldest, newest = (
        cl.root_queryset.order_by(order).values_list(field, flat=True).first()
        for order in ("pk", "-pk")
    )
    if oldest is None or newest is None:
        return {"show": False}
    first, last = sorted([_local_date(oldest), _local_date(newest)])
    links = _CalendarLinks(cl, field, first, last)
    try:
        year, month, day = (
            int(cl.params[name]) if name in cl.params else None for name in links.fields
        )
        selected = date(year or 1, month or 1, day or 1)
    except (TypeError, ValueError):
        return {"show": False}  # Django's own filter already rejected these parameters.
    if year is None and first.year == last.year:
        year = first.year
        if first.month == last.month:
            month = first.month
        selected = date(year, month or 1, 1)
    label = getattr(cl.opts.get_field(field), "verbose_name", field)
    base = {"show": True, "field_name": label}
    if year is not None and month is not None and day is not None:
        return {**base, **links.day(selected)}
    if year is not None and month is not None:
        return {**base, **links.month(year, month)}
    if year is not None:
        return {**base, **links.year(year)}
    return {**base, **links.years()}


class _CalendarLinks:
    """The back link and the choices of each level of the hierarchy, within [first, last]."""

    def __init__(self, cl: ChangeList, field: str, first: date, last: date) -> None:
        self.cl = cl
        self.fields = tuple(f"{field}__{part}" for part in ("year", "month", "day"))
        self.generic = f"{field}__"
        self.first, self.last = first, last

    def link(self, *parts: int | str) -> str:
        """The change list filtered to year, month and day, as many of them as given."""
        filters = dict(zip(self.fields[: len(parts)], parts, strict=True))
        return self.cl.get_query_string(filters, [self.generic])

    def day(self, selected: date) -> dict[str, Any]:
        return {
            "back": {
                "link": self.link(selected.year, selected.month),
                "title": capfirst(formats.date_format(selected, "YEAR_MONTH_FORMAT")),
            },
            "choices": [{"title": capfirst(formats.date_format(selected, "MONTH_DAY_FORMAT"))}],
        }

    def month(self, year: int, month: int) -> dict[str, Any]:
        days_in_month = calendar.monthrange(year, month)[1]
        month_days = [date(year, month, number) for number in range(1, days_in_month + 1)]
        return {
            "back": {"link": self.link(year), "title": str(year)},
            "choices": [
                {
                    "link": self.link(year, month, day.day),
                    "title": capfirst(formats.date_format(day, "MONTH_DAY_FORMAT")),
                }
                for day in _within(month_days, self.first, self.last)
            ],
        }

    def year(self, year: int) -> dict[str, Any]:
        months = [date(year, number, 1) for number in range(1, 13)]
        first_month, last_month = self.first.replace(day=1), self.last.replace(day=1)
        return {
            "back": {"link": self.link(), "title": gettext("All dates")},
            "choices": [
                {
                    "link": self.link(year, month_start.month),
                    "title": capfirst(formats.date_format(month_start, "YEAR_MONTH_FORMAT")),
                }
                for month_start in _within(months, first_month, last_month)
            ],
        }

    def years(self) -> dict[str, Any]:
        return {
            "back": None,
            "choices": [
                {"link": self.link(str(number)), "title": str(number)}
                for number in range(self.first.year, self.last.year + 1)
            ],
        }


def _local_date(value: datetime) -> date:
    return (timezone.localtime(value) if timezone.is_aware(value) else value).date()


def _within(dates: list[date], first: date, last: date) -> list[date]:
    """The dates inside [first, last]; all of them if none is (a period outside the range)."""
    inside = [day for day in dates if first <= day <= last]
    return inside or dates
