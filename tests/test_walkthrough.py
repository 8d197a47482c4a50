"""A new user's first ten minutes: a fresh project from `startproject`, the installed package
(tox and the dist env install the built wheel), one setting to guard every DRF view, then the
mistakes `manage.py check` must catch before the first request."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("rest_framework")  # The base env (no DRF) leaves this walkthrough out.

SETTINGS = """
INSTALLED_APPS += ["rest_framework", "django_idempotency", "shop"]
IDEMPOTENCY_GUARD_ALL_VIEWS = True
ALLOWED_HOSTS = ["testserver"]  # What django.test.Client sends.
"""

VIEWS = """
from rest_framework.response import Response
from rest_framework.views import APIView

RUNS = {"orders": 0, "pings": 0}


class OrderView(APIView):
    authentication_classes = permission_classes = []

    def post(self, request):
        RUNS["orders"] += 1
        return Response({"order": RUNS["orders"]}, status=201)


class PingView(APIView):
    authentication_classes = permission_classes = []
    idempotency_exempt = True

    def post(self, request):
        RUNS["pings"] += 1
        return Response({"ping": RUNS["pings"]})
"""

URLS = """
from django.urls import path

from shop.views import OrderView, PingView

urlpatterns = [path("orders/", OrderView.as_view()), path("ping/", PingView.as_view())]
"""

DRIVE = """
import json
from django.test import Client
from shop.views import RUNS

client = Client()
def post(url):
    return client.post(url, {"item": "book"}, content_type="application/json",
                       headers={"Idempotency-Key": "order-1"})

first, retry = post("/orders/"), post("/orders/")
pings = [post("/ping/"), post("/ping/")]
print(json.dumps({
    "statuses": [first.status_code, retry.status_code],
    "replayed": retry.headers.get("Idempotent-Replayed"),
    "same_body": first.content == retry.content,
    "runs": RUNS,
    "ping_replayed": [p.headers.get("Idempotent-Replayed") for p in pings],
}))
"""

MISTAKES = """
from django_idempotency.contrib.rest_framework import IdempotencyMixin
from rest_framework.views import APIView


class RefundView(APIView, IdempotencyMixin):  # The mixin must come first.
    def post(self, request): ...
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "django", "startproject", "mysite", str(tmp_path)], check=True
    )
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "views.py").write_text(VIEWS)
    settings = tmp_path / "mysite" / "settings.py"
    settings.write_text(settings.read_text() + SETTINGS)
    (tmp_path / "mysite" / "urls.py").write_text(URLS)
    manage(tmp_path, "migrate", "--verbosity", "0")
    return tmp_path


def manage(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
    )


def test_one_setting_guards_every_drf_view_and_an_exempt_view_is_left_alone(project: Path) -> None:
    result = manage(project, "shell", "--command", DRIVE)

    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["statuses"] == [201, 201]
    assert outcome["replayed"] == "true"
    assert outcome["same_body"] is True
    assert outcome["runs"] == {"orders": 1, "pings": 2}  # The exempt view ran both times.
    assert outcome["ping_replayed"] == [None, None]


def test_check_reports_a_wrong_mixin_order_and_a_misspelt_setting(project: Path) -> None:
    (project / "shop" / "refunds.py").write_text(MISTAKES)
    urls = project / "mysite" / "urls.py"
    urls.write_text(
        urls.read_text()
        + textwrap.dedent("""
            from shop.refunds import RefundView
            urlpatterns.append(path("refunds/", RefundView.as_view()))
        """)
    )
    settings = project / "mysite" / "settings.py"
    settings.write_text(settings.read_text() + "IDEMPOTENCY_TTLL = 3600\n")

    result = manage(project, "check")

    assert result.returncode == 1
    assert "django_idempotency.E013" in result.stderr
    assert "shop.refunds.RefundView" in result.stderr
    assert "django_idempotency.W005" in result.stderr
    assert (
        "IDEMPOTENCY_TTLL is not a django-idempotency setting; did you mean IDEMPOTENCY_TTL?"
        in (result.stderr)
    )
