"""The admin: browse, filter, search, inspect and purge records; read-only otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.db import connection
from django.db.models.signals import pre_delete
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import path, reverse
from django.utils import timezone

from django_idempotency import admin as record_admin
from django_idempotency.admin import actions as admin_actions
from django_idempotency.core.outcomes import Scope
from django_idempotency.models import IdempotencyRecord
from django_idempotency.stores import PurgeResult, StoreUnavailable, get_store
from django_idempotency.stores.base import ALL_AT_DEFAULTS, PurgeOptions
from django_idempotency.stores.database import DatabaseStore
from tests.factories import IdempotencyRecordFactory, UserFactory
from tests.utils import lose_database

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:django_idempotency_idempotencyrecord_changelist")


class RecordingStore(DatabaseStore):
    """The database store, noting which scopes it was asked to forget (the cache tier's job)."""

    forgotten: list[Scope] = []

    def forget(self, scopes: Iterable[Scope]) -> None:
        self.forgotten.extend(scopes)


class UnavailableStore(DatabaseStore):
    def purge(self, now: datetime, options: PurgeOptions = ALL_AT_DEFAULTS) -> PurgeResult:
        if options.dry_run:
            return super().purge(now, options)
        raise StoreUnavailable("connection refused")


@pytest.fixture(autouse=True)
def forgotten() -> Iterator[list[Scope]]:
    with override_settings(IDEMPOTENCY_STORE="tests.test_admin.RecordingStore"):
        RecordingStore.forgotten = []
        yield RecordingStore.forgotten


def staff_client(*codenames: str) -> Client:
    user = UserFactory(is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="django_idempotency", codename__in=codenames
        )
    )
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def viewer() -> Client:
    return staff_client("view_idempotencyrecord")


@pytest.fixture
def purger() -> Client:
    return staff_client("view_idempotencyrecord", "delete_idempotencyrecord")


def detail_url(record: IdempotencyRecord) -> str:
    return reverse("admin:django_idempotency_idempotencyrecord_change", args=[record.pk])


def listed(response: Any) -> set[str]:
    assert response.status_code == 200
    return {record.key for record in response.context["cl"].result_list}


def messages_of(response: Any) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def ago(**kwargs: float) -> datetime:
    return timezone.now() - timedelta(**kwargs)


def expired(**kwargs: Any) -> IdempotencyRecord:
    return IdempotencyRecordFactory(expires_at=ago(minutes=1), **kwargs)  # type: ignore[no-any-return]


def stuck(**kwargs: Any) -> IdempotencyRecord:
    """In progress, its lease run out: the request holding it died."""
    return IdempotencyRecordFactory(  # type: ignore[no-any-return]
        in_progress=True, lease_expires_at=ago(seconds=5), **kwargs
    )


# The list.


def test_the_list_shows_the_records_columns(admin_client: Client) -> None:
    IdempotencyRecordFactory(
        key="4f1c0e2a",
        namespace="payments",
        owner="user:42",
        method="POST",
        path="/v1/payments/?expand=customer",
        response_status=201,
    )

    response = admin_client.get(CHANGELIST)

    assert listed(response) == {"4f1c0e2a"}
    content = response.content.decode()
    for text in ("4f1c0e2a", "payments", "user:42", "201", "POST /v1/payments/?expand=customer"):
        assert text in content
    headers = [str(header["text"]) for header in response.context["result_headers"]]
    assert headers[1:] == [
        "key",
        "namespace",
        "owner",
        "status",
        "response status",
        "request",
        "created at",
        "expires at",
        "expired",
    ]
    assert 'alt="False"' in content  # The "expired" boolean column.


@pytest.mark.parametrize(
    ("store", "says"),
    [
        pytest.param("database", None, id="database"),
        pytest.param(
            "redis",
            "The Redis store keeps the records in Redis (cache alias “idempotency”), where they"
            " expire by Redis TTL",
            id="redis",
            marks=pytest.mark.redis,
        ),
        pytest.param(
            "memory",
            "The configured store (django_idempotency.stores.memory.MemoryStore) keeps its"
            " records outside this table",
            id="memory",
        ),
    ],
    indirect=["store"],
)
def test_the_list_says_where_another_store_keeps_the_records(
    admin_client: Client, store: str, says: str | None
) -> None:
    response = admin_client.get(CHANGELIST)

    assert response.status_code == 200
    note = response.context["records_elsewhere"]
    if says is None:
        assert note is None
    else:
        assert says in note
        assert note in response.content.decode()


@override_settings(IDEMPOTENCY_STORE="myproject.stores.Missing")
def test_the_list_still_shows_the_records_when_the_store_setting_is_broken(
    admin_client: Client,
) -> None:
    # `manage.py check` names the broken setting; the list goes on showing this table.
    record = IdempotencyRecordFactory(key="kept")

    response = admin_client.get(CHANGELIST)

    assert response.status_code == 200
    assert response.context["records_elsewhere"] is None
    assert listed(response) == {record.key}


def test_the_list_costs_the_same_queries_for_3_or_30_records(admin_client: Client) -> None:
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(CHANGELIST).status_code == 200
        return len(captured)

    IdempotencyRecordFactory.create_batch(3)
    few = queries()
    IdempotencyRecordFactory.create_batch(27)

    assert queries() == few


def test_the_list_never_loads_bodies(admin_client: Client) -> None:
    IdempotencyRecordFactory()

    with CaptureQueriesContext(connection) as captured:
        admin_client.get(CHANGELIST)

    owner = connection.ops.quote_name("owner")
    assert any(owner in query["sql"] for query in captured)  # The list's own query.
    assert all("response_body" not in query["sql"] for query in captured)


def test_newest_records_come_first(admin_client: Client) -> None:
    for key in ("first", "second", "third"):
        IdempotencyRecordFactory(key=key)

    response = admin_client.get(CHANGELIST)

    assert [r.key for r in response.context["cl"].result_list] == ["third", "second", "first"]


def test_there_is_no_add_button_and_no_full_count(admin_client: Client) -> None:
    IdempotencyRecordFactory()

    response = admin_client.get(CHANGELIST)

    add_url = reverse("admin:django_idempotency_idempotencyrecord_add")
    assert f'href="{add_url}"' not in response.content.decode()
    assert response.context["cl"].show_full_result_count is False


# Filters: every choice of each.


@pytest.fixture
def assorted() -> None:
    IdempotencyRecordFactory(key="ok", namespace="payments", response_status=201)
    IdempotencyRecordFactory(key="moved", namespace="payments", response_status=303)
    IdempotencyRecordFactory(key="declined", namespace="refunds", response_status=402)
    IdempotencyRecordFactory(key="broken", namespace="refunds", response_status=503)
    IdempotencyRecordFactory(key="running", namespace="payouts", in_progress=True)
    IdempotencyRecordFactory(key="old", namespace="payouts", expires_at=ago(seconds=1))


@pytest.mark.usefixtures("assorted")
@pytest.mark.parametrize(
    ("query", "keys"),
    [
        ("status__exact=in_progress", {"running"}),
        ("status__exact=completed", {"ok", "moved", "declined", "broken", "old"}),
        ("namespace=payments", {"ok", "moved"}),
        ("namespace=refunds", {"declined", "broken"}),
        ("namespace=payouts", {"running", "old"}),
        ("response_class=2xx", {"ok", "old"}),
        ("response_class=3xx", {"moved"}),
        ("response_class=4xx", {"declined"}),
        ("response_class=5xx", {"broken"}),
        ("expired=yes", {"old"}),
        ("expired=no", {"ok", "moved", "declined", "broken", "running"}),
        ("response_class=9xx", {"ok", "moved", "declined", "broken", "running", "old"}),
        ("namespace=refunds&response_class=5xx", {"broken"}),
    ],
)
def test_each_filter_choice(admin_client: Client, query: str, keys: set[str]) -> None:
    assert listed(admin_client.get(f"{CHANGELIST}?{query}")) == keys


@pytest.mark.usefixtures("assorted")
def test_the_filters_offer_their_choices(admin_client: Client) -> None:
    response = admin_client.get(CHANGELIST)

    choices = {
        str(spec.title): [str(choice["display"]) for choice in spec.choices(response.context["cl"])]
        for spec in response.context["cl"].filter_specs
    }
    assert choices == {
        "status": ["All", "in progress", "completed"],
        "namespace": ["All", "payments", "payouts", "refunds"],
        "response status class": ["All", "2xx", "3xx", "4xx", "5xx"],
        "expired": ["All", "Yes", "No"],
    }


def test_the_namespace_choices_stop_at_their_limit(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    for namespace in ("a", "b", "c"):
        IdempotencyRecordFactory(namespace=namespace)
    monkeypatch.setattr(record_admin.NamespaceFilter, "max_choices", 2)

    assert record_admin.distinct_namespaces("default", 2) == ["a", "b"]
    content = admin_client.get(CHANGELIST).content.decode()
    assert "?namespace=b" in content
    assert "?namespace=c" not in content


def test_filtered_lists_follow_the_index_of_their_filter(admin_client: Client) -> None:
    IdempotencyRecordFactory(key="later", in_progress=True, lease_expires_at=ago(seconds=-60))
    IdempotencyRecordFactory(key="stuck", in_progress=True, lease_expires_at=ago(seconds=60))
    IdempotencyRecordFactory(key="long-ago", expires_at=ago(hours=2))
    IdempotencyRecordFactory(key="just-now", expires_at=ago(seconds=1))

    in_progress = admin_client.get(f"{CHANGELIST}?status__exact=in_progress")
    expired_first = admin_client.get(f"{CHANGELIST}?expired=yes")

    assert [r.key for r in in_progress.context["cl"].result_list] == ["stuck", "later"]
    assert [r.key for r in expired_first.context["cl"].result_list] == ["just-now", "long-ago"]


# Search: exact key or owner, beginning of a path.


@pytest.mark.parametrize(
    ("term", "keys"),
    [
        ("0b7e5a1c-2f4d", {"0b7e5a1c-2f4d"}),
        ("0b7e5a1c", set()),  # Keys match whole: pasted, not typed.
        ("user:7", {"0b7e5a1c-2f4d"}),
        ("user:", set()),
        ("/v1/refunds/", {"9d3f"}),
        ("/v1/payments/pay_123/capture", {"0b7e5a1c-2f4d"}),
        ("refunds", set()),  # Paths match by their beginning.
    ],
)
def test_search(admin_client: Client, term: str, keys: set[str]) -> None:
    IdempotencyRecordFactory(
        key="0b7e5a1c-2f4d", owner="user:7", path="/v1/payments/pay_123/capture"
    )
    IdempotencyRecordFactory(key="9d3f", owner="user:8", path="/v1/refunds/")

    assert listed(admin_client.get(CHANGELIST, {"q": term})) == keys


# Date hierarchy, drawn from the calendar.


def test_the_date_hierarchy_offers_the_days_and_filters_by_day(admin_client: Client) -> None:
    today = timezone.localtime() if settings.USE_TZ else timezone.now()
    yesterday = today - timedelta(days=1)
    IdempotencyRecordFactory(key="yesterday", created_at=yesterday)
    IdempotencyRecordFactory(key="today", created_at=today)

    response = admin_client.get(CHANGELIST)
    hierarchy = response.context["calendar_hierarchy"]
    day = f"created_at__day={today.day}"
    by_day = admin_client.get(
        f"{CHANGELIST}?created_at__year={today.year}&created_at__month={today.month}&{day}"
    )

    assert hierarchy["show"]
    links = [choice["link"] for choice in hierarchy["choices"]]
    if yesterday.month == today.month:
        assert any(f"created_at__day={yesterday.day}" in link for link in links)
        assert any(day in link for link in links)
    assert f'href="{links[-1]}"'.replace("&", "&amp;") in response.content.decode()
    assert listed(by_day) == {"today"}
    assert by_day.context["calendar_hierarchy"]["choices"] == [{"title": today.strftime("%B %-d")}]


def _noon(year: int, month: int, day: int) -> datetime:
    """Noon UTC, aware or naive as USE_TZ has datetimes (the suite also runs with USE_TZ=0)."""
    moment = datetime(year, month, day, 12, tzinfo=UTC)
    return moment if settings.USE_TZ else timezone.make_naive(moment)


def test_the_date_hierarchy_levels(admin_client: Client) -> None:
    IdempotencyRecordFactory(created_at=_noon(2023, 11, 30))
    IdempotencyRecordFactory(created_at=_noon(2024, 2, 10))

    years = admin_client.get(CHANGELIST).context["calendar_hierarchy"]
    months = admin_client.get(f"{CHANGELIST}?created_at__year=2024").context["calendar_hierarchy"]
    elsewhere = admin_client.get(f"{CHANGELIST}?created_at__year=2020").context[
        "calendar_hierarchy"
    ]
    days = admin_client.get(f"{CHANGELIST}?created_at__year=2023&created_at__month=11").context[
        "calendar_hierarchy"
    ]

    IdempotencyRecord.objects.filter(created_at__year=2023).update(created_at=_noon(2024, 1, 5))
    one_year = admin_client.get(CHANGELIST).context["calendar_hierarchy"]

    assert [c["title"] for c in years["choices"]] == ["2023", "2024"]
    assert [c["title"] for c in one_year["choices"]] == ["January 2024", "February 2024"]
    assert years["back"] is None
    assert [c["title"] for c in months["choices"]] == ["January 2024", "February 2024"]
    assert len(elsewhere["choices"]) == 12  # Outside the range: the whole calendar.
    assert [c["title"] for c in days["choices"]] == ["November 30"]
    assert days["back"]["title"] == "2023"


def test_no_date_hierarchy_without_records_or_with_bad_dates(admin_client: Client) -> None:
    assert admin_client.get(CHANGELIST).context["calendar_hierarchy"] == {"show": False}
    IdempotencyRecordFactory()
    bad = admin_client.get(f"{CHANGELIST}?created_at__year=2024&created_at__month=13")
    assert bad.status_code in (200, 302)
    if bad.status_code == 200:
        assert bad.context["calendar_hierarchy"] == {"show": False}


def test_a_calendar_hierarchy_with_an_unparseable_year() -> None:
    class FakeChangeList:
        date_hierarchy = "created_at"
        opts = IdempotencyRecord._meta
        root_queryset = IdempotencyRecord.objects.all()
        params = {"created_at__year": "twenty"}

        def get_query_string(self, new: dict[str, Any], remove: list[str]) -> str:
            return "?"

    IdempotencyRecordFactory()

    assert record_admin.calendar_hierarchy(FakeChangeList()) == {"show": False}  # type: ignore[arg-type]


# Counting: exact on SQLite and for small results, PostgreSQL's estimate for large ones.


def test_small_results_are_counted_exactly(admin_client: Client) -> None:
    IdempotencyRecordFactory.create_batch(3)

    response = admin_client.get(CHANGELIST)

    assert response.context["cl"].result_count == 3
    assert response.context["cl"].paginator.estimated is False
    assert "idempotency-estimated" not in response.content.decode()


def test_a_plain_list_is_counted_exactly() -> None:
    paginator = record_admin.EstimatedCountPaginator([1, 2, 3], 2)
    assert (paginator.count, paginator.estimated) == (3, False)


@pytest.mark.postgresql
def test_large_results_show_the_planner_estimate(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    IdempotencyRecordFactory.create_batch(30)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_idempotency_record")
    monkeypatch.setattr(record_admin.EstimatedCountPaginator, "estimate_from", 10)

    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(CHANGELIST)

    assert response.context["cl"].paginator.estimated is True
    assert response.context["cl"].result_count > 0
    assert "PostgreSQL\u2019s estimate" in response.content.decode()
    assert not any("COUNT(" in query["sql"] for query in captured)


# The detail page.


def test_the_detail_page_is_read_only(admin_client: Client) -> None:
    record = IdempotencyRecordFactory(key="pay-1", fingerprint="f" * 64)

    response = admin_client.get(detail_url(record))

    content = response.content.decode()
    assert response.status_code == 200
    assert "pay-1" in content
    assert "f" * 64 in content
    assert 'name="_save"' not in content
    assert response.context["adminform"].form.fields == {}  # Every field is shown, none edited.
    assert response.context["title"] == "View idempotency record"


def test_the_detail_page_shows_the_operation_read_only(admin_client: Client) -> None:
    record = IdempotencyRecordFactory()

    response = admin_client.get(detail_url(record))

    assert record.operation_id in response.content.decode()
    assert "operation_id" in record_admin.IdempotencyRecordAdmin.readonly_fields


def test_the_detail_page_shows_headers_as_a_table(admin_client: Client) -> None:
    record = IdempotencyRecordFactory(
        response_headers=[
            ["Content-Type", "application/json"],
            ["Location", "/v1/payments/pay_123"],
            ["X-Evil", "<script>alert(1)</script>"],
        ]
    )

    content = admin_client.get(detail_url(record)).content.decode()

    assert '<table class="idempotency-headers">' in content
    assert "<tr><td>Location</td><td>/v1/payments/pay_123</td></tr>" in content
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in content
    assert "<script>alert(1)</script>" not in content


def test_the_detail_page_pretty_prints_json_bodies(admin_client: Client) -> None:
    body = {"id": "pay_123", "amount": 1200, "note": "<b>café</b>"}
    record = IdempotencyRecordFactory(response_body=json.dumps(body).encode())

    content = admin_client.get(detail_url(record)).content.decode()

    assert '<pre class="idempotency-body">{\n  &quot;id&quot;: &quot;pay_123&quot;,' in content
    assert "&quot;amount&quot;: 1200," in content
    assert "&lt;b&gt;café&lt;/b&gt;" in content


def test_the_detail_page_truncates_large_bodies_and_gives_their_size(admin_client: Client) -> None:
    body = json.dumps({"items": ["x" * 100] * 1000}).encode()
    record = IdempotencyRecordFactory(response_body=body)

    content = admin_client.get(detail_url(record)).content.decode()

    pre = content.split('<pre class="idempotency-body">')[1].split("</pre>")[0]
    assert len(pre) < 11 * 1024
    assert pre.endswith("…")
    assert f"Truncated to its first 10,240 characters; the full body is {len(body):,} bytes." in (
        content
    )


def test_a_body_without_a_content_type_is_still_pretty_printed(admin_client: Client) -> None:
    record = IdempotencyRecordFactory(
        response_headers=[["Location", "/v1/payments/pay_1"]], response_body=b'{"id":"pay_1"}'
    )

    content = admin_client.get(detail_url(record)).content.decode()

    assert (
        '<pre class="idempotency-body">{\n  &quot;id&quot;: &quot;pay_1&quot;\n}</pre>' in content
    )


def test_the_detail_page_describes_binary_bodies(admin_client: Client) -> None:
    record = IdempotencyRecordFactory(
        response_headers=[["Content-Type", "image/png"]], response_body=b"\x89PNG\r\n" + bytes(2042)
    )

    content = admin_client.get(detail_url(record)).content.decode()

    assert "2,048 bytes of image/png" in content
    assert "PNG" not in content.split("idempotency-binary")[1][:40]


def test_the_detail_page_shows_the_lease(admin_client: Client) -> None:
    lease_expires_at = timezone.now() + timedelta(seconds=30)
    record = IdempotencyRecordFactory(
        in_progress=True, lease_token="c0ffee" * 5 + "00", lease_expires_at=lease_expires_at
    )

    response = admin_client.get(detail_url(record))

    content = response.content.decode()
    assert "Lease holder" in content
    assert "c0ffee" * 5 + "00" in content
    assert "Lease expires at" in content
    shown = response.context["adminform"].form.instance.lease_expires_at
    assert shown == lease_expires_at


@pytest.mark.parametrize(
    ("body", "content_type", "shown"),
    [
        (b'{"a": [1, 2]}', "application/problem+json", "{\n  &quot;a&quot;: [\n    1,"),
        (b'{"a": 1}', "", "{\n  &quot;a&quot;: 1\n}"),  # No type, but JSON.
        (b"{not json", "application/json", "{not json"),
        (b"plain <text>", "text/plain; charset=utf-8", "plain &lt;text&gt;"),
        ("caf\xe9".encode("latin-1"), 'text/plain; charset="latin-1"', "café"),
        (b"<a/>", "application/xml", "&lt;a/&gt;"),
        (b"", "application/json", "Empty body."),
        (b"text", "text/plain; charset=no-such-charset", "4 bytes of text/plain"),
        (b"\xff\xfe", "text/plain", "2 bytes of text/plain"),
        (b"\x00\x01", "", "2 bytes of unknown type"),
        (b"%PDF-1.7", "application/pdf", "8 bytes of application/pdf"),
        (b"x", "application/octet-stream", "1 byte of application/octet-stream"),
    ],
)
def test_render_body(body: bytes, content_type: str, shown: str) -> None:
    assert shown in record_admin.render_body(body, content_type)


def test_render_body_previews_huge_bodies_without_parsing_them() -> None:
    body = ("é" * (record_admin.PRETTY_PRINT_MAX_BYTES)).encode()
    rendered = record_admin.render_body(body, "application/json")
    assert "é" * 100 in rendered
    assert f"the full body is {len(body):,} bytes" in rendered


def test_render_body_keeps_whole_characters_when_cutting_a_huge_body() -> None:
    body = b"a" + ("é" * record_admin.PRETTY_PRINT_MAX_BYTES).encode()  # The cut splits an é.
    rendered = record_admin.render_body(body, "text/plain")
    assert "Truncated" in rendered


def test_render_body_calls_a_huge_undecodable_body_binary() -> None:
    body = b"\xff" * (record_admin.PRETTY_PRINT_MAX_BYTES + 1)
    assert "bytes of text/plain" in record_admin.render_body(body, "text/plain")


@pytest.mark.parametrize("depth", [100_000, 2_000])
def test_a_deeply_nested_json_body_is_shown_raw(admin_client: Client, depth: int) -> None:
    # Too deep to parse (or to indent) within Python's recursion limit: shown as stored.
    record = IdempotencyRecordFactory(response_body=b"[" * depth + b"]" * depth)

    response = admin_client.get(detail_url(record))

    assert response.status_code == 200
    if depth == 2_000:  # Within reach of some Pythons' parsers (3.13's): indented, or raw.
        assert '<pre class="idempotency-body">[' in response.content.decode()
        return
    shown = "[" * min(depth, record_admin.BODY_PREVIEW_CHARS)
    assert f'<pre class="idempotency-body">{shown}' in response.content.decode()


def test_an_in_progress_record_has_no_body_or_headers(admin_client: Client) -> None:
    record = IdempotencyRecordFactory(in_progress=True)

    response = admin_client.get(detail_url(record))

    assert response.status_code == 200
    assert '<pre class="idempotency-body">' not in response.content.decode()
    assert '<table class="idempotency-headers">' not in response.content.decode()


# Actions: confirmation, effect, message.


def post_action(client: Client, action: str, *records: IdempotencyRecord, **extra: Any) -> Any:
    data = {"action": action, "index": "0", "_selected_action": [r.pk for r in records], **extra}
    return client.post(CHANGELIST + extra.pop("query", ""), data)


def confirm(client: Client, action: str, *records: IdempotencyRecord, **extra: Any) -> Any:
    data = {"action": action, "post": "yes", "_selected_action": [r.pk for r in records], **extra}
    return client.post(CHANGELIST, data, follow=True)


def test_the_actions_replace_delete_selected(admin_client: Client) -> None:
    IdempotencyRecordFactory()

    choices = dict(admin_client.get(CHANGELIST).context["action_form"].fields["action"].choices)

    choices.pop("")  # The blank choice, worded differently across Django versions.
    assert "delete_selected" not in choices
    assert choices == {
        "purge_selected": "Purge selected idempotency records",
        "purge_expired": "Purge all expired idempotency records",
        "release_abandoned": "Release abandoned idempotency claims",
        "step_happened": "Step happened (resume after it)",
        "step_did_not_happen": "Step did not happen (run it again)",
    }


def test_purge_selected_asks_first(admin_client: Client) -> None:
    chosen = IdempotencyRecordFactory.create_batch(2)
    IdempotencyRecordFactory(key="kept")

    response = post_action(admin_client, "purge_selected", *chosen)

    content = response.content.decode()
    assert response.status_code == 200
    assert response.templates[0].name == "django_idempotency/admin/confirm_action.html"
    assert "Purge 2 idempotency records?" in content
    assert all(f"<code>{record.key}</code>" in content for record in chosen)
    assert 'name="post" value="yes"' in content
    assert f'href="{CHANGELIST}"' in content  # Cancel goes back to the list.
    assert IdempotencyRecord.objects.count() == 3


def test_purge_selected_deletes_and_forgets_after_the_commit(
    admin_client: Client, forgotten: list[Scope], django_capture_on_commit_callbacks: Any
) -> None:
    chosen = [
        IdempotencyRecordFactory(namespace="payments", owner="user:1", key="a"),
        IdempotencyRecordFactory(namespace="payments", owner="user:2", key="b"),
    ]
    IdempotencyRecordFactory(key="kept")

    with django_capture_on_commit_callbacks(execute=True):
        response = confirm(admin_client, "purge_selected", *chosen)
        # A replay before the commit would copy the record back into the cache.
        assert forgotten == []

    assert messages_of(response) == ["Purged 2 idempotency records."]
    assert list(IdempotencyRecord.objects.values_list("key", flat=True)) == ["kept"]
    assert sorted(forgotten, key=lambda s: s.key) == [
        Scope("payments", "user:1", "a"),
        Scope("payments", "user:2", "b"),
    ]


@pytest.mark.django_db(transaction=True)
def test_outside_a_test_transaction_each_batch_is_forgotten_once_committed(
    forgotten: list[Scope], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(admin_actions, "DELETE_BATCH_SIZE", 2)
    chosen = [IdempotencyRecordFactory(key=f"k{n}") for n in range(3)]
    client = Client()
    client.force_login(UserFactory(username="ops", is_staff=True, is_superuser=True))

    with caplog.at_level("INFO", logger="django_idempotency"):
        response = confirm(client, "purge_selected", *chosen)

    assert messages_of(response) == ["Purged 3 idempotency records."]
    assert sorted(scope.key for scope in forgotten) == ["k0", "k1", "k2"]
    assert "ops purged 3 selected idempotency records in the admin" in caplog.messages


def _ops_client() -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(UserFactory(username="ops", is_staff=True, is_superuser=True))
    return client


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("atomic_requests")
@pytest.mark.parametrize(
    ("action", "make"), [("purge_selected", IdempotencyRecordFactory), ("release_abandoned", stuck)]
)
def test_under_atomic_requests_each_batch_still_commits_on_its_own(
    monkeypatch: pytest.MonkeyPatch, action: str, make: Any
) -> None:
    monkeypatch.setattr(admin_actions, "DELETE_BATCH_SIZE", 2)
    records = [make(key=f"k{n}") for n in range(3)]
    deleted: list[str] = []

    def fail_in_the_second_batch(sender: Any, instance: IdempotencyRecord, **kwargs: Any) -> None:
        deleted.append(instance.key)
        if len(deleted) > 2:
            raise RuntimeError("the database refused the second batch")

    pre_delete.connect(fail_in_the_second_batch, sender=IdempotencyRecord)
    try:
        response = confirm(_ops_client(), action, *records)
    finally:
        pre_delete.disconnect(fail_in_the_second_batch, sender=IdempotencyRecord)

    assert response.status_code == 500
    # The first batch was committed before the second began: it stays purged.
    assert IdempotencyRecord.objects.count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("atomic_requests")
def test_under_atomic_requests_the_purge_of_expired_records_runs_outside_the_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    between_batches: list[bool] = []

    def forget(self: DatabaseStore, scopes: Iterable[Scope]) -> None:
        between_batches.append(connection.in_atomic_block)

    monkeypatch.setattr(RecordingStore, "forget", forget)
    expired(key="old-1")
    stuck(key="dead", expires_at=ago(minutes=1))

    response = confirm(_ops_client(), "purge_expired")

    assert messages_of(response) == [
        "Purged 1 expired record. Purged 1 abandoned in-progress record."
    ]
    assert between_batches == [False]  # No transaction left open between batches.
    assert not IdempotencyRecord.objects.exists()


def test_purge_selected_counts_one_in_the_singular(admin_client: Client) -> None:
    record = IdempotencyRecordFactory()

    asked = post_action(admin_client, "purge_selected", record)
    done = confirm(admin_client, "purge_selected", record)

    assert "Purge 1 idempotency record?" in asked.content.decode()
    assert messages_of(done) == ["Purged 1 idempotency record."]


def test_purge_selected_across_pages_keeps_the_filters(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admin_actions, "DELETE_BATCH_SIZE", 2)
    old = [expired(key=f"old-{n}") for n in range(13)]
    IdempotencyRecordFactory(key="live")
    url = f"{CHANGELIST}?expired=yes"
    data = {"action": "purge_selected", "select_across": "1", "_selected_action": [old[0].pk]}

    asked = admin_client.post(url, {**data, "index": "0"})
    done = admin_client.post(url, {**data, "post": "yes"}, follow=True)

    content = asked.content.decode()
    assert "Purge 13 idempotency records?" in content
    assert "and 3 more" in content
    assert 'name="select_across" value="1"' in content
    assert messages_of(done) == ["Purged 13 idempotency records."]
    assert list(IdempotencyRecord.objects.values_list("key", flat=True)) == ["live"]


def test_purge_selected_needs_a_selection(admin_client: Client) -> None:
    IdempotencyRecordFactory()

    response = admin_client.post(
        CHANGELIST, {"action": "purge_selected", "index": "0"}, follow=True
    )

    assert "Items must be selected" in messages_of(response)[0]
    assert IdempotencyRecord.objects.count() == 1


@pytest.mark.parametrize("data", [{"index": "x"}, {"index": "3"}, {}], ids=["bad", "none", "no"])
def test_a_broken_action_post_runs_nothing(admin_client: Client, data: dict[str, str]) -> None:
    expired()

    response = admin_client.post(CHANGELIST, {"action": "purge_expired", **data}, follow=True)

    assert response.status_code == 200
    assert IdempotencyRecord.objects.count() == 1


def test_purge_expired_asks_first_without_a_selection(admin_client: Client) -> None:
    expired()
    expired()
    stuck(expires_at=ago(minutes=1))
    stuck()  # Not expired: its retry resumes it, so the purge keeps it.
    IdempotencyRecordFactory()

    response = admin_client.post(CHANGELIST, {"action": "purge_expired", "index": "0"})

    assert response.status_code == 200
    assert (
        "2 expired records will be purged. "
        "1 abandoned in-progress record (expired, its lease run out) will be purged."
        in response.content.decode()
    )
    assert IdempotencyRecord.objects.count() == 5


def test_purge_expired_purges_through_the_store(
    admin_client: Client, forgotten: list[Scope]
) -> None:
    gone = [expired(key="old-1"), expired(key="old-2"), stuck(key="dead", expires_at=ago(hours=1))]
    IdempotencyRecordFactory(key="live")
    IdempotencyRecordFactory(key="running", in_progress=True)
    stuck(key="crashed")  # Its lease ran out, its record has not expired: its retry may come.
    chosen = IdempotencyRecordFactory(key="chosen")  # A selection changes nothing.

    response = confirm(admin_client, "purge_expired", chosen)

    assert messages_of(response) == [
        "Purged 2 expired records. Purged 1 abandoned in-progress record."
    ]
    assert set(IdempotencyRecord.objects.values_list("key", flat=True)) == {
        "live",
        "running",
        "crashed",
        "chosen",
    }
    assert {scope.key for scope in forgotten} == {record.key for record in gone}


def test_purge_expired_with_nothing_to_purge(admin_client: Client) -> None:
    IdempotencyRecordFactory()

    asked = admin_client.post(CHANGELIST, {"action": "purge_expired", "index": "0"})
    done = confirm(admin_client, "purge_expired")

    assert "0 expired records will be purged. 0 abandoned" in asked.content.decode()
    assert 'value="Yes, I\u2019m sure"' not in asked.content.decode()
    assert "Nothing to do" in asked.content.decode()
    assert messages_of(done) == [
        "Purged 0 expired records. Purged 0 abandoned in-progress records."
    ]


@override_settings(IDEMPOTENCY_STORE="tests.test_admin.UnavailableStore")
def test_purge_expired_when_the_store_is_down(admin_client: Client) -> None:
    expired()

    response = confirm(admin_client, "purge_expired")

    assert messages_of(response) == [
        "The purge stopped: the database holding idempotency records cannot be reached "
        "(connection refused). Try again when it is back; records already purged stay purged."
    ]
    assert IdempotencyRecord.objects.count() == 1


class LostDatabase:
    """Loses the real database the moment the admin calls one of its own functions.

    Nothing is faked: the function and everything after it run against a database that is not
    there. The hook only times the loss to the middle of the request, after Django loaded the
    session and the user (which a database lost from the start would fail on first).
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.original: dict[str, Any] = {}

    def when_calling(self, name: str) -> None:
        real = getattr(admin_actions, name)

        def losing(*args: Any, **kwargs: Any) -> Any:
            if not self.original:
                self.original = lose_database(connection)
            return real(*args, **kwargs)

        self.monkeypatch.setattr(admin_actions, name, losing)

    def restore(self) -> None:
        if self.original:
            connection.close()
            connection.settings_dict.clear()
            connection.settings_dict.update(self.original)
            self.original = {}


@pytest.fixture
def lost_database(monkeypatch: pytest.MonkeyPatch) -> Iterator[LostDatabase]:
    lost = LostDatabase(monkeypatch)
    yield lost
    lost.restore()


def superuser_client() -> Client:
    client = Client()
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    return client


LOST = "the database holding idempotency records cannot be reached"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("action", "lost_in", "asking"),
    [
        ("purge_selected", "delete_and_forget", False),
        ("purge_expired", "purge_expired_records", True),
        ("purge_expired", "purge_expired_records", False),
        ("release_abandoned", "_abandoned_claims", True),
        ("release_abandoned", "_abandoned_claims", False),
    ],
)
def test_a_lost_database_is_a_message_and_a_redirect_back_never_a_500(
    lost_database: LostDatabase, action: str, lost_in: str, asking: bool
) -> None:
    records = [expired(), stuck()]
    client = superuser_client()
    lost_database.when_calling(lost_in)
    url = f"{CHANGELIST}?expired=yes"
    data: dict[str, Any] = {"action": action, "_selected_action": [r.pk for r in records]}
    data.update({"index": "0"} if asking else {"post": "yes"})

    response = client.post(url, data)

    assert response.status_code == 302
    assert response.url == url  # Back where the user was, filters kept.
    lost_database.restore()
    [message] = list(client.get(response.url).context["messages"])
    noun, done = ("release", "released") if action == "release_abandoned" else ("purge", "purged")
    assert message.level_tag == "error"
    assert str(message).startswith(f"The {noun} stopped: {LOST} (")
    assert str(message).endswith(f"Try again when it is back; records already {done} stay {done}.")
    assert IdempotencyRecord.objects.count() == 2


def test_release_abandoned_asks_first(admin_client: Client) -> None:
    stuck(key="dead-1")
    stuck(key="dead-2")
    IdempotencyRecordFactory(in_progress=True)

    response = admin_client.post(CHANGELIST, {"action": "release_abandoned", "index": "0"})

    content = response.content.decode()
    assert "Release 2 in-progress records whose leases ran out?" in content
    assert "<code>dead-1</code>" in content
    assert "<code>dead-2</code>" in content
    assert IdempotencyRecord.objects.count() == 3


def test_release_abandoned_releases_only_run_out_leases(
    admin_client: Client, forgotten: list[Scope], django_capture_on_commit_callbacks: Any
) -> None:
    stuck(key="dead", namespace="payments", owner="user:3")
    IdempotencyRecordFactory(key="running", in_progress=True)
    expired(key="old")  # Completed: purging it is purge_expired's job.

    with django_capture_on_commit_callbacks(execute=True):
        response = confirm(admin_client, "release_abandoned")

    assert messages_of(response) == ["Released 1 abandoned claim."]
    assert set(IdempotencyRecord.objects.values_list("key", flat=True)) == {"running", "old"}
    assert forgotten == [Scope("payments", "user:3", "dead")]


def test_release_abandoned_in_the_plural(admin_client: Client) -> None:
    stuck()
    stuck()

    response = confirm(admin_client, "release_abandoned")

    assert messages_of(response) == ["Released 2 abandoned claims."]


def test_a_lease_renewed_after_the_confirmation_is_not_released(admin_client: Client) -> None:
    record = stuck()
    assert (
        "Release 1"
        in admin_client.post(
            CHANGELIST, {"action": "release_abandoned", "index": "0"}
        ).content.decode()
    )
    # A retry took the key over between the confirmation and the click.
    IdempotencyRecord.objects.filter(pk=record.pk).update(lease_expires_at=ago(seconds=-60))

    response = confirm(admin_client, "release_abandoned")

    assert messages_of(response) == ["Released 0 abandoned claims."]
    assert IdempotencyRecord.objects.filter(pk=record.pk).exists()


def test_a_staff_user_with_the_delete_permission_can_purge(purger: Client) -> None:
    record = expired()

    asked = purger.post(CHANGELIST, {"action": "purge_expired", "index": "0"})
    done = confirm(purger, "purge_expired")

    assert asked.status_code == 200
    assert messages_of(done) == ["Purged 1 expired record. Purged 0 abandoned in-progress records."]
    assert not IdempotencyRecord.objects.filter(pk=record.pk).exists()


def test_deleting_one_record_forgets_it_after_the_commit(
    purger: Client, forgotten: list[Scope], django_capture_on_commit_callbacks: Any
) -> None:
    record = IdempotencyRecordFactory(namespace="payments", owner="user:9", key="one")
    url = reverse("admin:django_idempotency_idempotencyrecord_delete", args=[record.pk])

    with django_capture_on_commit_callbacks(execute=True):
        response = purger.post(url, {"post": "yes"})
        assert forgotten == []

    assert response.status_code == 302
    assert not IdempotencyRecord.objects.exists()
    assert forgotten == [Scope("payments", "user:9", "one")]


def test_delete_queryset_forgets_too(
    rf: Any, forgotten: list[Scope], django_capture_on_commit_callbacks: Any
) -> None:
    record = IdempotencyRecordFactory(namespace="payments", owner="", key="q")
    model_admin = record_admin.IdempotencyRecordAdmin(IdempotencyRecord, record_admin.admin.site)

    with django_capture_on_commit_callbacks(execute=True):
        model_admin.delete_queryset(rf.post("/"), IdempotencyRecord.objects.all())

    assert not IdempotencyRecord.objects.filter(pk=record.pk).exists()
    assert forgotten == [Scope("payments", "", "q")]


# Permissions: view only sees; nobody adds or edits.


def test_a_viewer_sees_the_list_and_the_record_but_no_actions(viewer: Client) -> None:
    record = IdempotencyRecordFactory()

    listing = viewer.get(CHANGELIST)
    detail = viewer.get(detail_url(record))

    assert listed(listing) == {record.key}
    assert listing.context["action_form"] is None
    assert 'name="action"' not in listing.content.decode()
    assert detail.status_code == 200
    assert "deletelink" not in detail.content.decode()


@pytest.mark.parametrize("action", ["purge_selected", "purge_expired", "release_abandoned"])
def test_a_viewer_cannot_run_the_actions(viewer: Client, action: str) -> None:
    record = expired()
    stuck()

    asked = viewer.post(
        CHANGELIST, {"action": action, "index": "0", "_selected_action": [record.pk]}
    )
    forced = confirm(viewer, action, record)

    assert asked.status_code in (200, 302)
    assert b"Are you sure?" not in asked.content
    assert forced.status_code == 200
    assert "Purged" not in " ".join(messages_of(forced))
    assert IdempotencyRecord.objects.count() == 2


def test_a_viewer_cannot_delete(viewer: Client) -> None:
    record = IdempotencyRecordFactory()
    url = reverse("admin:django_idempotency_idempotencyrecord_delete", args=[record.pk])

    assert viewer.get(url).status_code == 403
    assert viewer.post(url, {"post": "yes"}).status_code == 403
    assert IdempotencyRecord.objects.filter(pk=record.pk).exists()


def test_a_user_without_view_permission_sees_nothing() -> None:
    record = IdempotencyRecordFactory()
    outsider = staff_client()

    assert outsider.get(CHANGELIST).status_code == 403
    assert outsider.get(detail_url(record)).status_code == 403


def test_nobody_adds_records(admin_client: Client) -> None:
    url = reverse("admin:django_idempotency_idempotencyrecord_add")

    assert admin_client.get(url).status_code == 403
    assert admin_client.post(url, {"key": "forged"}).status_code == 403
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.parametrize("user", ["admin_client", "purger", "viewer"])
def test_nobody_edits_records(user: str, request: pytest.FixtureRequest) -> None:
    client = request.getfixturevalue(user)
    record = IdempotencyRecordFactory(key="original", response_status=201)

    response = client.post(detail_url(record), {"key": "forged", "response_status": "200"})

    assert response.status_code == 403
    record.refresh_from_db()
    assert (record.key, record.response_status) == ("original", 201)


def test_the_admin_is_registered_with_the_default_site() -> None:
    from django.contrib import admin

    assert isinstance(admin.site._registry[IdempotencyRecord], record_admin.IdempotencyRecordAdmin)
    assert get_store().__class__ is RecordingStore


# IDEMPOTENCY_ADMIN, and replacing the admin with a project's own.

NO_ADMIN = """
import django
from django.conf import settings

settings.IDEMPOTENCY_ADMIN = False  # As a project's settings module would set it.
django.setup()

from django.contrib import admin
from django_idempotency.models import IdempotencyRecord

print(admin.site.is_registered(IdempotencyRecord))
"""


def test_idempotency_admin_false_leaves_the_records_out_of_the_admin() -> None:
    env = dict(os.environ)  # DJANGO_SETTINGS_MODULE included.
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    result = subprocess.run(
        [sys.executable, "-c", NO_ADMIN], env=env, capture_output=True, text=True, timeout=120
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


class ProjectRecordAdmin(record_admin.IdempotencyRecordAdmin):
    list_per_page = 20


@pytest.mark.django_db
def test_the_admin_can_be_replaced_as_the_docs_show(admin_client: Client) -> None:
    from django.contrib import admin

    admin.site.unregister(IdempotencyRecord)
    admin.site.register(IdempotencyRecord, ProjectRecordAdmin)

    class URLs:  # Admin URLs are bound to the admin classes registered when they are built.
        urlpatterns = [path("admin/", admin.site.urls)]

    try:
        with override_settings(ROOT_URLCONF=URLs):
            changelist = reverse("admin:django_idempotency_idempotencyrecord_changelist")
            response = admin_client.get(changelist)
        assert response.context["cl"].list_per_page == 20
    finally:
        admin.site.unregister(IdempotencyRecord)
        admin.site.register(IdempotencyRecord, record_admin.IdempotencyRecordAdmin)
