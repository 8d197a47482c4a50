"""A project that forgot "django_idempotency" in INSTALLED_APPS is told so, with the fix, by the
decorator, the mixin, the middleware, an idempotent function and task on the database store: not
an error about a model outside INSTALLED_APPS. The memory and Redis stores need no model: their
functions run without the app."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tests

# A fresh interpreter: in this one the app is installed and its model registered already.
PROBE = """
import json

import django
from django.conf import settings

settings.configure(
    SECRET_KEY="probe",
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "rest_framework"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    ROOT_URLCONF=None,
    MIDDLEWARE=[],
)
django.setup()

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError
from django.http import HttpResponse
from django.test import Client, override_settings
from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import idempotent, idempotent_function
from django_idempotency.conf import conf
from django_idempotency.contrib.rest_framework import IdempotencyMixin

answers = {}


def attempt(name, action):
    try:
        answers[name] = action()
    except Exception as exc:
        answers[name] = f"{type(exc).__name__}: {exc}"


def decorate():
    @idempotent
    def create_order(request):
        return HttpResponse(status=201)

    return "decorated"


def post(url, key):
    headers = {"Idempotency-Key": key} if key else {}
    return Client().post(url, {}, headers=headers).status_code


class Orders(IdempotencyMixin, APIView):
    authentication_classes = []

    def post(self, request):
        return Response(status=201)


def plain(request):
    return HttpResponse(status=201)


class MixinURLs:
    urlpatterns = [path("orders/", Orders.as_view())]


class PlainURLs:
    urlpatterns = [path("orders/", plain)]


def run_function():
    @idempotent_function(key="order_id")
    def charge(order_id):
        return {"charged": order_id}

    return charge("o-1")


def run_task():
    from celery import Celery
    from django_idempotency.contrib.celery import idempotent_task

    app = Celery("probe", set_as_current=False)
    app.conf.task_always_eager = True

    @idempotent_task(app=app)
    def send(order_id):
        return {"sent": order_id}

    return send.delay("o-1").get()


attempt("decorator", decorate)
try:
    decorate()
except ImproperlyConfigured as exc:  # What callers caught before keeps catching it.
    answers["caught as"] = ["ImproperlyConfigured", isinstance(exc, CommandError)]
attempt("function", run_function)
attempt("task", run_task)
with override_settings(IDEMPOTENCY_STORE="django_idempotency.stores.memory.MemoryStore"):
    conf.reload()  # Its receiver of setting_changed is connected by the app's ready(): not here.
    attempt("function, memory store", run_function)
with override_settings(ROOT_URLCONF=MixinURLs):
    attempt("mixin, keyed", lambda: post("/orders/", "k1"))
    attempt("mixin, no key", lambda: post("/orders/", None))
with override_settings(
    ROOT_URLCONF=PlainURLs, MIDDLEWARE=["django_idempotency.middleware.IdempotencyMiddleware"]
):
    attempt("middleware", lambda: post("/orders/", "k1"))
print(json.dumps(answers))
"""


@pytest.fixture(scope="module")
def answers() -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(Path(tests.__file__).resolve().parent.parent)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    result = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])  # type: ignore[no-any-return]


# AppNotInstalled: an ImproperlyConfigured that manage.py prints as this one line (a CommandError).
SAYS = (
    'AppNotInstalled: django_idempotency is not in INSTALLED_APPS: add "django_idempotency"'
    " to INSTALLED_APPS, then run `python manage.py migrate django_idempotency`."
)


@pytest.mark.parametrize(
    "entry_point",
    ["decorator", "mixin, keyed", "mixin, no key", "middleware", "function", "task"],
)
def test_each_entry_point_says_the_app_is_not_installed_and_how_to_fix_it(
    answers: dict[str, Any], entry_point: str
) -> None:
    assert answers[entry_point] == SAYS


def test_it_is_still_caught_as_improperly_configured_and_is_a_command_error(
    answers: dict[str, Any],
) -> None:
    assert answers["caught as"] == ["ImproperlyConfigured", True]


def test_a_function_on_the_memory_store_runs_without_the_app(answers: dict[str, Any]) -> None:
    # It needs no model, and worked so before: the app is asked for only by stores that do.
    assert answers["function, memory store"] == {"charged": "o-1"}
