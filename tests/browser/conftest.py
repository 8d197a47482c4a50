"""The `browser` marker, and a headless Chromium from Debian driven by Playwright."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections

CHROMIUM = "/usr/bin/chromium"
# Playwright's own browser download cannot be fetched here; Debian's chromium can be installed.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "browser: drives Chromium through Playwright against a live server"
    )


@pytest.fixture
def page(transactional_db: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A page in a headless Chromium; a missing browser or Playwright fails, never skips.

    It needs the database first: Playwright's sync API keeps an event loop running in this
    thread, and Django refuses database work in a thread with a running loop. The test's own
    ORM calls are plain synchronous ones all the same, hence DJANGO_ALLOW_ASYNC_UNSAFE while the
    browser is open.
    """
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium package.", pytrace=False)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright is missing: pip install playwright.", pytrace=False)
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        context = browser.new_context(viewport={"width": 1920, "height": 640}, locale="en-US")
        context.set_default_timeout(15_000)
        try:
            yield context.new_page()
        finally:
            context.close()
            browser.close()
            # Django keeps connections per context, and under Playwright the test runs in a
            # greenlet's context of its own: close what it opened there, or PostgreSQL refuses
            # to drop the test database at the end ("being accessed by other users").
            connections.close_all()
