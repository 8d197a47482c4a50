"""The admin in a real browser: sign in, search, inspect a record, purge what has expired."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from django_idempotency.models import IdempotencyRecord
from tests.factories import IdempotencyRecordFactory
from tests.utils import fingerprint_of

# What the browser adds to tests/test_admin.py, which runs on every database, is the page itself
# (its forms, links and scripts): it is the same page whatever the database, so it is driven on
# SQLite's runs only (Django 5.2 and 6) rather than started in Chromium on every server.
pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.sqlite]

IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
PASSWORD = "correct horse battery staple"
SEARCHED = "7c9e6679-7425-40de-944b-e07fc1f90ae7"


def payment(number: int, amount: int, status: str = "succeeded") -> dict[str, Any]:
    return {
        "id": f"pay_3Pq{number:04d}LkdIwHu7ix",
        "object": "payment",
        "amount": amount,
        "currency": "eur",
        "status": status,
        "customer": "cus_NffrFeUfNV2Hib",
        "metadata": {"order_id": f"ord_{number:06d}"},
        "created": 1718000000 + number,
    }


def record(
    key: str,
    path: str,
    status: int,
    body: dict[str, Any],
    *,
    minutes_ago: float,
    owner: str = "user:1042",
    namespace: str = "payments",
    ttl: timedelta = timedelta(hours=24),
) -> IdempotencyRecord:
    created_at = timezone.now() - timedelta(minutes=minutes_ago)
    return IdempotencyRecordFactory(  # type: ignore[no-any-return]
        key=key,
        namespace=namespace,
        owner=owner,
        path=path,
        fingerprint=fingerprint_of(path, {"amount": body.get("amount"), "currency": "eur"}),
        lease_token=f"{key[:8]}{key[-8:]}" * 2,
        response_status=status,
        response_headers=[
            ["Content-Type", "application/json"],
            ["Location", f"/v1/payments/{body.get('id', '')}"],
            ["X-Request-Id", f"req_{key[:8]}"],
        ],
        response_body=json.dumps(body).encode(),
        created_at=created_at,
        completed_at=created_at + timedelta(milliseconds=180),
        expires_at=created_at + ttl,
    )


def make_records() -> tuple[list[str], list[str]]:
    """Expired and live records of a payments API, oldest first; returns (live, expired) keys."""
    expired = [
        record(
            f"a3bb189e-8bf9-3888-9912-ace4e6543{number:03d}",
            "/v1/payments/",
            201,
            payment(number, 1000 + number),
            minutes_ago=60 * 26 - number,
            owner="user:1187",
        )
        for number in range(3)
    ]
    live = [
        record(
            "16fd2706-8baf-433b-82eb-8c7fada847da",
            "/v1/refunds/",
            201,
            {"id": "re_3Pq0004", "object": "refund", "amount": 500, "payment": "pay_3Pq0001"},
            minutes_ago=42,
            namespace="refunds",
        ),
        record(
            "6fa459ea-ee8a-4ca4-894e-db77e160355e",
            "/v1/payments/",
            402,
            {"type": "https://errors.example.com/card-declined", "title": "Card declined"},
            minutes_ago=17,
            owner="user:2210",
        ),
        record(
            "1b4e28ba-2fa1-41d2-883f-0016d3cca427",
            "/v1/payments/pay_3Pq0002LkdIwHu7ix/capture",
            200,
            payment(2, 1999),
            minutes_ago=9,
        ),
        record(SEARCHED, "/v1/payments/", 201, payment(1, 4200), minutes_ago=3),
        IdempotencyRecordFactory(
            in_progress=True,
            key="886313e1-3b8a-4372-9b90-0c9aee199e5d",
            namespace="payments",
            owner="user:3307",
            path="/v1/payments/",
            fingerprint=fingerprint_of("/v1/payments/", {"amount": 7300, "currency": "eur"}),
            created_at=timezone.now() - timedelta(seconds=4),
            expires_at=timezone.now() + timedelta(hours=24),
        ),
    ]
    return [r.key for r in live], [r.key for r in expired]


def test_sign_in_search_inspect_and_purge_expired(live_server: Any, page: Any) -> None:
    get_user_model().objects.create_superuser("ops", "ops@example.com", PASSWORD)
    live, expired = make_records()
    IMAGES.mkdir(parents=True, exist_ok=True)
    # Screenshots without the navigation sidebar leave room for every column.
    page.add_init_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")

    page.goto(f"{live_server.url}/admin/django_idempotency/idempotencyrecord/")
    page.fill("#id_username", "ops")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#result_list")
    for key in live + expired:
        assert page.locator("#result_list", has_text=key).count() == 1
    page.screenshot(path=str(IMAGES / "admin-changelist.png"), full_page=True)

    page.fill("#searchbar", SEARCHED)
    page.press("#searchbar", "Enter")
    page.wait_for_url(re.compile(r"\?q="))
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1
    rows.first.locator("th a").click()

    page.wait_for_selector(".field-body_preview")
    assert SEARCHED in page.locator(".field-key").inner_text()
    body = page.locator("pre.idempotency-body").inner_text()
    assert '"id": "pay_3Pq0001LkdIwHu7ix"' in body
    assert '"amount": 4200,' in body
    assert "X-Request-Id" in page.locator("table.idempotency-headers").inner_text()
    page.set_viewport_size({"width": 1280, "height": 640})  # Narrower: the fields read better.
    page.screenshot(path=str(IMAGES / "admin-detail.png"), full_page=True)
    page.set_viewport_size({"width": 1920, "height": 640})

    page.go_back()
    page.wait_for_url(re.compile(r"\?q="))
    page.click("#changelist-search a:has-text('Show all')")
    page.wait_for_selector("#result_list")
    page.select_option("select[name=action]", "purge_expired")
    page.click("button[name=index]")

    question = page.locator(".idempotency-question").inner_text()
    assert "3 expired records will be purged. 0 abandoned in-progress records" in question
    page.click("input[type=submit][value^='Yes']")

    page.wait_for_selector(".messagelist")
    assert (
        "Purged 3 expired records. Purged 0 abandoned in-progress records."
        in page.locator(".messagelist").inner_text()
    )
    listing = page.locator("#result_list").inner_text()
    assert all(key in listing for key in live)
    assert not any(key in listing for key in expired)
    assert set(IdempotencyRecord.objects.values_list("key", flat=True)) == set(live)
