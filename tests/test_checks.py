"""System checks: each id fires on its misconfiguration and stays silent on a correct one."""

from __future__ import annotations

import io
import re
import types
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.checks import ERROR, WARNING, CheckMessage, run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.http import HttpRequest, HttpResponse
from django.test import override_settings
from django.urls import include, path
from rest_framework import viewsets
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter
from rest_framework.views import APIView

from django_idempotency import checks, idempotent
from django_idempotency.contrib.rest_framework import IdempotencyMixin
from django_idempotency.stores.base import BaseStore
from django_idempotency.stores.database import DatabaseStore

# Some cases add aliases to DATABASES. The checks only read their ENGINE and never connect, so
# Django's warning that overriding DATABASES is unreliable does not apply to them. What the checks
# say depends on the database under test (some are SQLite's own) even where no query is made.
pytestmark = [
    pytest.mark.filterwarnings("ignore:Overriding setting DATABASES:UserWarning"),
    pytest.mark.database,
]

DOCS = Path(__file__).resolve().parent.parent / "docs" / "checks.md"
ID = re.compile(r"django_idempotency\.[EW]\d{3}")

# Spelled out as users see them: a renumbered id in the module fails these tests.
E001 = "django_idempotency.E001"
E002 = "django_idempotency.E002"
E003 = "django_idempotency.E003"
E004 = "django_idempotency.E004"
E005 = "django_idempotency.E005"
E006 = "django_idempotency.E006"
E007 = "django_idempotency.E007"
E008 = "django_idempotency.E008"
E009 = "django_idempotency.E009"
E010 = "django_idempotency.E010"
E011 = "django_idempotency.E011"
E012 = "django_idempotency.E012"
W001 = "django_idempotency.W001"
W002 = "django_idempotency.W002"
W003 = "django_idempotency.W003"
W004 = "django_idempotency.W004"
E013 = "django_idempotency.E013"
E014 = "django_idempotency.E014"
E015 = "django_idempotency.E015"
E016 = "django_idempotency.E016"
W005 = "django_idempotency.W005"
W006 = "django_idempotency.W006"
E017 = "django_idempotency.E017"
E018 = "django_idempotency.E018"
E019 = "django_idempotency.E019"
E020 = "django_idempotency.E020"
E021 = "django_idempotency.E021"
W007 = "django_idempotency.W007"
E022 = "django_idempotency.E022"
W008 = "django_idempotency.W008"
E023 = "django_idempotency.E023"
E024 = "django_idempotency.E024"
E025 = "django_idempotency.E025"
# Fernet keys made for these tests only (Fernet.generate_key()).
FERNET_KEY = "5pHGT1e0MXG1VOi1S9f7Yq3yHo9mB1kYp2lIuJ7vW3k="
REDIS_STORE = "django_idempotency.stores.redis.RedisStore"
MEMORY_STORE = "django_idempotency.stores.memory.MemoryStore"
IDEMPOTENCY_MIDDLEWARE = "django_idempotency.middleware.IdempotencyMiddleware"
CSRF_MIDDLEWARE = "django.middleware.csrf.CsrfViewMiddleware"
DEPLOY_ONLY = {W002, W003, E020}
DATABASE_ONLY = {W006, W007}  # Run by `check --database <alias>`: tested on a real database below.

SHARED_CACHE = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:9/0"}
POSTGRESQL = {"ENGINE": "django.db.backends.postgresql", "NAME": "idempotency"}
SQLITE = {"ENGINE": "django.db.backends.sqlite3", "NAME": "idempotency.sqlite3"}


class MemoryStore(BaseStore):
    """A store other than the database store; the checks never call it."""


class TenantStore(DatabaseStore):
    """A database store subclass: checked like the database store."""


class NotAStore:
    """A class that does not implement the store contract."""


def tenant_owner(request: HttpRequest) -> str:
    return "tenant-1"


OWNER_LABEL = "tenant-1"  # Importable, but not callable.


class LateMixinViewSet(viewsets.ViewSet, IdempotencyMixin):  # The mixin comes too late.
    def create(self, request: Request) -> Response:
        return Response(status=201)


class EarlyMixinViewSet(IdempotencyMixin, viewsets.ViewSet):
    def create(self, request: Request) -> Response:
        return Response(status=201)


class TypoView(IdempotencyMixin, APIView):
    idempotency_mode = "atomc"


class LeasedView(IdempotencyMixin, APIView):
    idempotency_mode = "lease"
    idempotency_ttl = timedelta(minutes=5)
    idempotency_required = True
    idempotency_exempt = False


def nested(viewset: type[viewsets.ViewSet]) -> list[Any]:
    """A viewset routed two includes deep, as versioned APIs route them."""
    router = SimpleRouter()
    router.register("charges", viewset, basename="charges")
    return [path("api/", include([path("v1/", include(router.urls))]))]


class MixinAfterAPIView:
    """A URLconf (ROOT_URLCONF accepts any object with `urlpatterns`)."""

    urlpatterns = nested(LateMixinViewSet)


class MixinFirst:
    urlpatterns = nested(EarlyMixinViewSet)


class MistypedAttribute:
    urlpatterns = [path("typo/", TypoView.as_view())]


class ValidAttributes:
    urlpatterns = [path("leased/", LeasedView.as_view())]


class MisspeltMethodView(IdempotencyMixin, APIView):
    idempotent_methods = ("POST", "PATHC")


class MisspeltMethod:
    urlpatterns = [path("orders/", MisspeltMethodView.as_view())]


class MisspeltRequiredView(IdempotencyMixin, APIView):
    idempotency_requried = True


class MisspeltMethodsView(IdempotencyMixin, APIView):
    idempotency_method = ("POST",)


class MisspeltRequired:
    urlpatterns = [path("orders/", MisspeltRequiredView.as_view())]


class MisspeltMethods:
    urlpatterns = [path("orders/", MisspeltMethodsView.as_view())]


class AtomicView(IdempotencyMixin, APIView):
    idempotency_mode = "atomic"


@idempotent(mode="atomic")
def atomic_function_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse(status=201)


class AtomicAttribute:
    urlpatterns = [path("atomic/", AtomicView.as_view())]


class AtomicDecorator:
    urlpatterns = [path("atomic-function/", atomic_function_view)]


@idempotent
class DecoratedViewSet(viewsets.ViewSet):  # On the class, not its actions.
    def create(self, request: Request) -> Response:
        return Response(status=201)


def create_order(request: Request) -> Response:
    return Response(status=201)


class DecoratorOnClass:
    urlpatterns = nested(DecoratedViewSet)


class DecoratorAboveAPIView:
    urlpatterns = [path("orders/", idempotent(api_view(["POST"])(create_order)))]


class DecoratorBelowAPIView:
    urlpatterns = [path("orders/", api_view(["POST"])(idempotent(create_order)))]


class FailingRouter:
    def db_for_write(self, model: type[Any], **hints: Any) -> str:
        raise RuntimeError("router is broken")


@contextmanager
def configured(**overrides: Any) -> Iterator[None]:
    """These settings; aliases given in DATABASES and CACHES are added to the existing ones."""
    for name in ("DATABASES", "CACHES"):
        if name in overrides:
            overrides[name] = {**getattr(settings, name), **overrides[name]}
    with override_settings(**overrides):
        yield


def ours(*, deploy: bool = True, **overrides: Any) -> list[CheckMessage]:
    """Our messages from every check `manage.py check [--deploy]` runs, under these settings."""
    with configured(**overrides):
        messages = run_checks(include_deployment_checks=deploy)
    return [message for message in messages if str(message.id).startswith("django_idempotency.")]


@pytest.fixture
def baseline() -> set[str]:
    """What the test settings alone report: W002 when the tests run on SQLite, else nothing."""
    return {str(message.id) for message in ours()}


FIRES = [
    pytest.param(E001, {"IDEMPOTENCY_TTL": "24h"}, ["IDEMPOTENCY_TTL", "'24h'"], id="E001-str"),
    pytest.param(E001, {"IDEMPOTENCY_LEASE": True}, ["IDEMPOTENCY_LEASE", "True"], id="E001-bool"),
    pytest.param(
        E001,
        {"IDEMPOTENCY_WAIT_TIMEOUT": float("nan")},
        ["IDEMPOTENCY_WAIT_TIMEOUT = nan", "not a usable duration"],
        id="E001-nan",
    ),
    pytest.param(
        E002, {"IDEMPOTENCY_LEASE": 0}, ["IDEMPOTENCY_LEASE = 0", "more than zero"], id="E002-lease"
    ),
    pytest.param(
        E002,
        {"IDEMPOTENCY_TTL": timedelta(seconds=-1)},
        ["IDEMPOTENCY_TTL = datetime.timedelta(days=-1, seconds=86399)", "more than zero"],
        id="E002-ttl",
    ),
    pytest.param(
        E002,
        {"IDEMPOTENCY_WAIT_TIMEOUT": -1},
        ["IDEMPOTENCY_WAIT_TIMEOUT = -1", "-1 seconds", "zero or more"],
        id="E002-wait-timeout",
    ),
    pytest.param(E003, {"IDEMPOTENCY_MODE": "atomc"}, ["IDEMPOTENCY_MODE", "'atomc'"], id="E003"),
    pytest.param(
        E003,
        {"IDEMPOTENCY_ON_CONFLICT": "block"},
        ["IDEMPOTENCY_ON_CONFLICT", "'block'"],
        id="E003-on-conflict",
    ),
    pytest.param(
        E003,
        {"IDEMPOTENCY_KEY_FORMAT": "UUID"},
        ["IDEMPOTENCY_KEY_FORMAT", "'UUID'"],
        id="E003-key-format",
    ),
    pytest.param(
        E004,
        {"IDEMPOTENCY_METHODS": ["POST", 1]},
        ["IDEMPOTENCY_METHODS = ['POST', 1]"],
        id="E004-methods",
    ),
    pytest.param(
        E004, {"IDEMPOTENCY_METHODS": b"POST"}, ["IDEMPOTENCY_METHODS = b'POST'"], id="E004-bytes"
    ),
    pytest.param(
        E004,
        {"IDEMPOTENCY_FINGERPRINT_IGNORE_FIELDS": "nonce"},
        ["IDEMPOTENCY_FINGERPRINT_IGNORE_FIELDS = 'nonce'"],
        id="E004-bare-string",
    ),
    pytest.param(
        E004,
        {"IDEMPOTENCY_EXEMPT_VIEWS": "accounts.views.SignInView"},
        ["IDEMPOTENCY_EXEMPT_VIEWS = 'accounts.views.SignInView' is not a collection of dotted"],
        id="E004-exempt-views-bare-string",
    ),
    pytest.param(
        E004,
        {"IDEMPOTENCY_STORED_CLIENT_ERRORS": 402},
        ["IDEMPOTENCY_STORED_CLIENT_ERRORS = 402"],
        id="E004-not-a-collection",
    ),
    pytest.param(
        E004,
        {"IDEMPOTENCY_STORED_CLIENT_ERRORS": [402, 500]},
        ["IDEMPOTENCY_STORED_CLIENT_ERRORS = [402, 500]", "4xx"],
        id="E004-not-4xx",
    ),
    pytest.param(
        E005,
        {"IDEMPOTENCY_HEADER": "Idempotency Key"},
        ["IDEMPOTENCY_HEADER = 'Idempotency Key'", "not a valid HTTP header name"],
        id="E005-space",
    ),
    pytest.param(
        E005,
        {"IDEMPOTENCY_HEADER": "Idempotency-Key:"},
        ["IDEMPOTENCY_HEADER = 'Idempotency-Key:'"],
        id="E005-colon",
    ),
    pytest.param(E005, {"IDEMPOTENCY_HEADER": ""}, ["IDEMPOTENCY_HEADER = ''"], id="E005-empty"),
    pytest.param(E005, {"IDEMPOTENCY_HEADER": None}, ["IDEMPOTENCY_HEADER = None"], id="E005-none"),
    pytest.param(
        E006,
        {"IDEMPOTENCY_NAMESPACE": "n" * 101},
        ["IDEMPOTENCY_NAMESPACE", "101 characters", "limit is 100"],
        id="E006",
    ),
    pytest.param(
        E007,
        {"IDEMPOTENCY_OWNER_RESOLVER": "tests.nowhere.owner"},
        ["IDEMPOTENCY_OWNER_RESOLVER = 'tests.nowhere.owner' cannot be imported"],
        id="E007-owner-resolver",
    ),
    pytest.param(
        E007,
        {"IDEMPOTENCY_FINGERPRINT": 42},
        ["IDEMPOTENCY_FINGERPRINT must be a dotted path or a callable, not 42"],
        id="E007-fingerprint",
    ),
    pytest.param(
        E007,
        {"IDEMPOTENCY_STORE": "myproject.stores.RedisStore"},
        ["IDEMPOTENCY_STORE = 'myproject.stores.RedisStore' cannot be imported"],
        id="E007-store",
    ),
    pytest.param(
        E007,
        {"IDEMPOTENCY_STORE": DatabaseStore},
        ["IDEMPOTENCY_STORE", "DatabaseStore", "cannot be imported"],
        id="E007-store-class",
    ),
    pytest.param(
        E008,
        {"IDEMPOTENCY_OWNER_RESOLVER": "tests.test_checks.OWNER_LABEL"},
        ["IDEMPOTENCY_OWNER_RESOLVER = 'tests.test_checks.OWNER_LABEL' is not callable"],
        id="E008",
    ),
    pytest.param(
        E009,
        {"IDEMPOTENCY_STORE": "tests.test_checks.NotAStore"},
        ["IDEMPOTENCY_STORE = 'tests.test_checks.NotAStore' is not a BaseStore subclass"],
        id="E009-class",
    ),
    pytest.param(
        E009,
        {"IDEMPOTENCY_STORE": "django_idempotency.http.owners.authenticated_user"},
        ["IDEMPOTENCY_STORE", "authenticated_user' is not a BaseStore subclass"],
        id="E009-function",
    ),
    pytest.param(
        E010,
        {"IDEMPOTENCY_CACHE": "idempotency"},
        ["IDEMPOTENCY_CACHE = 'idempotency' is not an alias in CACHES"],
        id="E010",
    ),
    pytest.param(
        E011,
        {"IDEMPOTENCY_DATABASE": "idempotency"},
        ["IDEMPOTENCY_DATABASE = 'idempotency' is not an alias in DATABASES"],
        id="E011",
    ),
    pytest.param(
        E012,
        {
            "DATABASES": {"legacy": {"ENGINE": "django.db.backends.dummy"}},
            "IDEMPOTENCY_DATABASE": "legacy",
        },
        [
            "IDEMPOTENCY_DATABASE = 'legacy'",
            "django.db.backends.dummy",
            "PostgreSQL, MariaDB and SQLite",
        ],
        id="E012",
    ),
    pytest.param(
        E012,
        {
            "DATABASES": {"legacy": {"ENGINE": "django.db.backends.dummy"}},
            "IDEMPOTENCY_DATABASE": "legacy",
            "IDEMPOTENCY_STORE": "tests.test_checks.TenantStore",
        },
        ["IDEMPOTENCY_DATABASE = 'legacy'", "PostgreSQL, MariaDB and SQLite"],
        id="E012-subclass",
    ),
    pytest.param(
        E012,
        {
            "DATABASES": {"erp": {"ENGINE": "django.db.backends.oracle", "NAME": "erp"}},
            "IDEMPOTENCY_DATABASE": "erp",
        },
        ["django.db.backends.oracle (oracle)", "PostgreSQL, MariaDB and SQLite"],
        id="E012-oracle-without-its-driver",
    ),
    pytest.param(
        E012,
        {
            "DATABASES": {"mssql": {"ENGINE": "mssql", "NAME": "orders"}},
            "IDEMPOTENCY_DATABASE": "mssql",
        },
        ["IDEMPOTENCY_DATABASE = 'mssql'", "uses mssql (mssql)"],
        id="E012-third-party",
    ),
    pytest.param(
        W001,
        {
            "CACHES": {"idempotency": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
            "IDEMPOTENCY_CACHE": "idempotency",
        },
        ["IDEMPOTENCY_CACHE = 'idempotency'", "LocMemCache"],
        id="W001-locmem",
    ),
    pytest.param(
        W001,
        {
            "CACHES": {"idempotency": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}},
            "IDEMPOTENCY_CACHE": "idempotency",
        },
        ["IDEMPOTENCY_CACHE = 'idempotency'", "DummyCache"],
        id="W001-dummy",
    ),
    pytest.param(
        W002,
        {"DATABASES": {"lite": SQLITE}, "IDEMPOTENCY_DATABASE": "lite"},
        ["'lite' is SQLite", "IDEMPOTENCY_DATABASE = 'lite'"],
        id="W002",
    ),
    pytest.param(W003, {"IDEMPOTENCY_ENABLED": False}, ["IDEMPOTENCY_ENABLED = False"], id="W003"),
    pytest.param(
        W004,
        {"IDEMPOTENCY_TTL": 30, "IDEMPOTENCY_LEASE": 60},
        ["IDEMPOTENCY_TTL (30 seconds)", "IDEMPOTENCY_LEASE (60 seconds)"],
        id="W004",
    ),
    pytest.param(
        E013,
        {"ROOT_URLCONF": MixinAfterAPIView},
        ["tests.test_checks.LateMixinViewSet", "api/v1/", "IdempotencyMixin after DRF's APIView"],
        id="E013-nested-viewset",
    ),
    pytest.param(
        E024,
        {"ROOT_URLCONF": DecoratorOnClass},
        [
            "@idempotent was applied to the class tests.test_checks.DecoratedViewSet (routed at"
            " 'api/v1/^charges/$'): it cannot guard a class",
        ],
        id="E024-on-a-viewset-class",
    ),
    pytest.param(
        E024,
        {"ROOT_URLCONF": DecoratorAboveAPIView},
        [
            "@idempotent was applied to tests.test_checks.create_order, a view built by as_view()"
            " or @api_view (routed at 'orders/'): it would run before authentication",
        ],
        id="E024-above-api-view",
    ),
    pytest.param(
        E014,
        {"ROOT_URLCONF": MistypedAttribute},
        ["tests.test_checks.TypoView.idempotency_mode = 'atomc'", "one of atomic, lease"],
        id="E014",
    ),
    pytest.param(
        E015,
        {"IDEMPOTENCY_ENABLED": "false"},
        ["IDEMPOTENCY_ENABLED must be True or False, not 'false'"],
        id="E015-string",
    ),
    pytest.param(
        E015,
        {"IDEMPOTENCY_GUARD_ALL_VIEWS": 1},
        ["IDEMPOTENCY_GUARD_ALL_VIEWS must be True or False, not 1"],
        id="E015-int",
    ),
    pytest.param(
        E016,
        {"IDEMPOTENCY_MAX_STORED_BYTES": "1MB"},
        ["IDEMPOTENCY_MAX_STORED_BYTES must be a number of bytes", "'1MB'"],
        id="E016",
    ),
    pytest.param(
        E021,
        {"IDEMPOTENCY_REDIS_WAIT_REPLICAS": "1"},
        ["IDEMPOTENCY_REDIS_WAIT_REPLICAS must be a number (an int of 0 or more), not '1'"],
        id="E021-string",
    ),
    pytest.param(
        E021,
        {"IDEMPOTENCY_REDIS_WAIT_REPLICAS": -1},
        ["IDEMPOTENCY_REDIS_WAIT_REPLICAS", "not -1"],
        id="E021-negative",
    ),
    pytest.param(
        E022,
        {"IDEMPOTENCY_METHODS": ("POST", "PATHC")},
        ["IDEMPOTENCY_METHODS lists 'PATHC', which is not an HTTP method"],
        id="E022-setting",
    ),
    pytest.param(
        E022,
        {"ROOT_URLCONF": MisspeltMethod},
        ["tests.test_checks.MisspeltMethodView.idempotent_methods lists 'PATHC'"],
        id="E022-view",
    ),
    pytest.param(
        W008,
        {"ROOT_URLCONF": MisspeltRequired},
        [
            "tests.test_checks.MisspeltRequiredView.idempotency_requried (routed at 'orders/') is"
            " not an idempotency attribute; did you mean idempotency_required?"
        ],
        id="W008-required",
    ),
    pytest.param(
        W008,
        {"ROOT_URLCONF": MisspeltMethods},
        ["MisspeltMethodsView.idempotency_method", "did you mean idempotent_methods?"],
        id="W008-methods",
    ),
    pytest.param(
        E023,
        {"IDEMPOTENCY_ENCRYPTION_KEYS": [FERNET_KEY, "hunter2"]},
        ["IDEMPOTENCY_ENCRYPTION_KEYS[1] is not a Fernet key", "Fernet.generate_key()"],
        id="E023-not-a-key",
    ),
    pytest.param(
        E023,
        {"IDEMPOTENCY_ENCRYPTION_KEYS": FERNET_KEY},
        ["IDEMPOTENCY_ENCRYPTION_KEYS must be a non-empty list of Fernet keys"],
        id="E023-a-bare-key",
    ),
    pytest.param(
        E025,
        {"IDEMPOTENCY_FORM_FIELD": "idempotency key"},
        ["IDEMPOTENCY_FORM_FIELD = 'idempotency key' is not a form field name of letters"],
        id="E025-space",
    ),
    pytest.param(
        E025,
        {"IDEMPOTENCY_FORM_FIELD": "csrfmiddlewaretoken"},
        ["IDEMPOTENCY_FORM_FIELD = 'csrfmiddlewaretoken' is the CSRF token's field"],
        id="E025-csrf-token",
    ),
    pytest.param(
        E025,
        {"IDEMPOTENCY_FORM_FIELD": ""},
        ["IDEMPOTENCY_FORM_FIELD = '' is not a form field name"],
        id="E025-empty",
    ),
    pytest.param(
        E023,
        {"IDEMPOTENCY_ENCRYPTION_KEYS": []},
        ["IDEMPOTENCY_ENCRYPTION_KEYS must be a non-empty list of Fernet keys"],
        id="E023-empty",
    ),
    pytest.param(
        E002,
        {"IDEMPOTENCY_REDIS_WAIT_TIMEOUT": 0},
        ["IDEMPOTENCY_REDIS_WAIT_TIMEOUT = 0", "more than zero"],
        id="E002-redis-wait-timeout",
    ),
    pytest.param(
        W005,
        {"IDEMPOTENCY_LEASE_SECONDS": 30},
        ["IDEMPOTENCY_LEASE_SECONDS is not a django-idempotency setting", "IDEMPOTENCY_LEASE?"],
        id="W005-typo",
    ),
    pytest.param(
        W005,
        {"IDEMPOTENCY_KEY_HEADER": "Idempotency-Key"},
        ["IDEMPOTENCY_KEY_HEADER is a setting of another idempotency package"],
        id="W005-other-package",
    ),
    pytest.param(
        E017,
        {"MIDDLEWARE": [*settings.MIDDLEWARE, IDEMPOTENCY_MIDDLEWARE, CSRF_MIDDLEWARE]},
        ["IdempotencyMiddleware is listed before django.middleware.csrf.CsrfViewMiddleware"],
        id="E017",
    ),
    pytest.param(
        E018,
        {
            "IDEMPOTENCY_STORE": REDIS_STORE,
            "CACHES": {"default": SHARED_CACHE},
            "IDEMPOTENCY_MODE": "atomic",
        },
        ['IDEMPOTENCY_MODE = "atomic" asks for atomic mode', f"{REDIS_STORE!r} has lease mode"],
        id="E018-setting",
    ),
    pytest.param(
        E018,
        # Any store without atomic mode, not only those shipped.
        {"IDEMPOTENCY_STORE": "tests.test_checks.MemoryStore", "ROOT_URLCONF": AtomicAttribute},
        ["tests.test_checks.AtomicView (routed at 'atomic/') asks for atomic mode"],
        id="E018-view-attribute",
    ),
    pytest.param(
        E018,
        {
            "IDEMPOTENCY_STORE": REDIS_STORE,
            "CACHES": {"default": SHARED_CACHE},
            "ROOT_URLCONF": AtomicDecorator,
        },
        ["tests.test_checks.atomic_function_view (routed at 'atomic-function/') asks for atomic"],
        id="E018-decorated-view",
    ),
    pytest.param(
        E019,
        {"IDEMPOTENCY_STORE": REDIS_STORE, "IDEMPOTENCY_REDIS_CACHE": "records"},
        ["IDEMPOTENCY_REDIS_CACHE = 'records' is not an alias in CACHES"],
        id="E019-unknown-alias",
    ),
    pytest.param(
        E019,
        {"IDEMPOTENCY_STORE": REDIS_STORE},
        ["IDEMPOTENCY_REDIS_CACHE = 'default' uses", "LocMemCache", "django-redis cache"],
        id="E019-not-django-redis",
    ),
    pytest.param(
        E020,
        {"IDEMPOTENCY_STORE": MEMORY_STORE},
        [f"IDEMPOTENCY_STORE = {MEMORY_STORE!r} keeps records in each process's memory"],
        id="E020",
    ),
]

SILENT = [
    pytest.param(E001, {"IDEMPOTENCY_TTL": timedelta(hours=1)}, id="E001-timedelta"),
    pytest.param(E001, {"IDEMPOTENCY_LEASE": 30, "IDEMPOTENCY_WAIT_TIMEOUT": 0.5}, id="E001-num"),
    pytest.param(E002, {"IDEMPOTENCY_WAIT_TIMEOUT": 0}, id="E002-no-wait"),
    pytest.param(E002, {"IDEMPOTENCY_LEASE": 1, "IDEMPOTENCY_TTL": 60}, id="E002-positive"),
    pytest.param(E003, {"IDEMPOTENCY_MODE": "lease", "IDEMPOTENCY_ON_CONFLICT": "wait"}, id="E003"),
    pytest.param(E003, {"IDEMPOTENCY_KEY_FORMAT": "uuid_or_ulid"}, id="E003-key-format"),
    pytest.param(E003, {"IDEMPOTENCY_KEY_FORMAT": None}, id="E003-no-key-format"),
    pytest.param(E004, {"IDEMPOTENCY_METHODS": "put"}, id="E004-one-method"),
    pytest.param(
        E004, {"IDEMPOTENCY_EXEMPT_VIEWS": ["accounts.views.SignInView"]}, id="E004-exempt-views"
    ),
    pytest.param(
        E004,
        {
            "IDEMPOTENCY_METHODS": ["post", "PUT"],
            "IDEMPOTENCY_FINGERPRINT_IGNORE_FIELDS": ["nonce"],
            "IDEMPOTENCY_STORED_CLIENT_ERRORS": (402, 409),
        },
        id="E004-collections",
    ),
    pytest.param(E004, {"IDEMPOTENCY_STORED_CLIENT_ERRORS": frozenset()}, id="E004-empty"),
    pytest.param(E005, {"IDEMPOTENCY_HEADER": "X-Request-Id"}, id="E005"),
    pytest.param(E025, {"IDEMPOTENCY_FORM_FIELD": "form-key_2"}, id="E025"),
    pytest.param(E025, {"IDEMPOTENCY_FORM_FIELD": None}, id="E025-header-only"),
    pytest.param(E006, {"IDEMPOTENCY_NAMESPACE": "n" * 100}, id="E006"),
    pytest.param(E007, {"IDEMPOTENCY_OWNER_RESOLVER": tenant_owner}, id="E007-callable"),
    pytest.param(
        E007,
        {"IDEMPOTENCY_FINGERPRINT": "django_idempotency.http.requests.request_fingerprint"},
        id="E007-path",
    ),
    pytest.param(E008, {"IDEMPOTENCY_OWNER_RESOLVER": "tests.test_checks.tenant_owner"}, id="E008"),
    pytest.param(E009, {"IDEMPOTENCY_STORE": "tests.test_checks.MemoryStore"}, id="E009"),
    pytest.param(
        E010,
        {"CACHES": {"idempotency": SHARED_CACHE}, "IDEMPOTENCY_CACHE": "idempotency"},
        id="E010",
    ),
    pytest.param(E010, {"IDEMPOTENCY_CACHE": ""}, id="E010-empty-means-none"),
    pytest.param(E011, {"IDEMPOTENCY_DATABASE": "default"}, id="E011"),
    pytest.param(E011, {"IDEMPOTENCY_DATABASE": ""}, id="E011-empty-means-none"),
    pytest.param(
        E012,
        {"DATABASES": {"pg": POSTGRESQL}, "IDEMPOTENCY_DATABASE": "pg"},
        id="E012-postgresql",
    ),
    pytest.param(
        E012,
        {
            "DATABASES": {"maria": {"ENGINE": "django.db.backends.mysql", "NAME": "shop"}},
            "IDEMPOTENCY_DATABASE": "maria",
        },
        id="E012-mariadb",
    ),
    pytest.param(
        E012,
        {
            "DATABASES": {"legacy": {"ENGINE": "django.db.backends.dummy"}},
            "IDEMPOTENCY_DATABASE": "legacy",
            "IDEMPOTENCY_STORE": "tests.test_checks.MemoryStore",
        },
        id="E012-other-store",
    ),
    pytest.param(
        W001,
        {"CACHES": {"idempotency": SHARED_CACHE}, "IDEMPOTENCY_CACHE": "idempotency"},
        id="W001-redis",
    ),
    pytest.param(W001, {"IDEMPOTENCY_CACHE": None}, id="W001-no-tier"),
    pytest.param(
        W002,
        {"DATABASES": {"pg": POSTGRESQL}, "IDEMPOTENCY_DATABASE": "pg"},
        id="W002-postgresql",
    ),
    pytest.param(W002, {"IDEMPOTENCY_STORE": "tests.test_checks.MemoryStore"}, id="W002-store"),
    pytest.param(W003, {"IDEMPOTENCY_ENABLED": True}, id="W003"),
    pytest.param(W004, {"IDEMPOTENCY_TTL": 60, "IDEMPOTENCY_LEASE": 60}, id="W004"),
    pytest.param(E013, {"ROOT_URLCONF": MixinFirst}, id="E013"),
    pytest.param(E024, {"ROOT_URLCONF": DecoratorBelowAPIView}, id="E024-below-api-view"),
    pytest.param(E013, {"ROOT_URLCONF": "tests.urls"}, id="E013-test-urls"),
    pytest.param(E014, {"ROOT_URLCONF": ValidAttributes}, id="E014"),
    pytest.param(
        E015,
        {"IDEMPOTENCY_ENABLED": True, "IDEMPOTENCY_REQUIRED": False, "IDEMPOTENCY_ADMIN": True},
        id="E015",
    ),
    pytest.param(E016, {"IDEMPOTENCY_MAX_STORED_BYTES": None}, id="E016-no-limit"),
    pytest.param(E016, {"IDEMPOTENCY_MAX_STORED_BYTES": 0}, id="E016-zero"),
    pytest.param(E021, {"IDEMPOTENCY_REDIS_WAIT_REPLICAS": 0}, id="E021-zero"),
    pytest.param(E021, {"IDEMPOTENCY_REDIS_WAIT_REPLICAS": 2}, id="E021"),
    pytest.param(E022, {"IDEMPOTENCY_METHODS": ["post", "PUT", "delete"]}, id="E022-setting"),
    pytest.param(E022, {"ROOT_URLCONF": ValidAttributes}, id="E022-view"),
    pytest.param(W008, {"ROOT_URLCONF": "tests.urls"}, id="W008-test-urls"),
    pytest.param(E023, {"IDEMPOTENCY_ENCRYPTION_KEYS": None}, id="E023-in-clear"),
    pytest.param(E023, {"IDEMPOTENCY_ENCRYPTION_KEYS": [FERNET_KEY]}, id="E023"),
    pytest.param(
        E023, {"IDEMPOTENCY_ENCRYPTION_KEYS": [FERNET_KEY.encode(), FERNET_KEY]}, id="E023-bytes"
    ),
    pytest.param(
        W005,
        {"IDEMPOTENCY_GUARD_ALL_VIEWS": False, "IDEMPOTENCY_ERROR_FORMAT": "drf"},
        id="W005",
    ),
    pytest.param(
        E017,
        {"MIDDLEWARE": [*settings.MIDDLEWARE, CSRF_MIDDLEWARE, IDEMPOTENCY_MIDDLEWARE]},
        id="E017",
    ),
    pytest.param(
        E017,
        {
            "MIDDLEWARE": [
                *settings.MIDDLEWARE,
                IDEMPOTENCY_MIDDLEWARE,
                # After it, but with no process_view() to skip; one that does not import is
                # Django's to report when it loads the middleware.
                "django.middleware.common.CommonMiddleware",
                "myproject.middleware.Missing",
            ]
        },
        id="E017-nothing-skipped-after-it",
    ),
    pytest.param(
        E018,
        {"IDEMPOTENCY_STORE": REDIS_STORE, "CACHES": {"default": SHARED_CACHE}},
        id="E018-mode-unset",
    ),
    pytest.param(
        E018,
        {
            "IDEMPOTENCY_STORE": REDIS_STORE,
            "CACHES": {"default": SHARED_CACHE},
            "IDEMPOTENCY_MODE": "lease",
            "ROOT_URLCONF": ValidAttributes,
        },
        id="E018-lease",
    ),
    pytest.param(
        E018, {"IDEMPOTENCY_MODE": "atomic", "ROOT_URLCONF": AtomicAttribute}, id="E018-database"
    ),
    pytest.param(
        E019,
        {
            "IDEMPOTENCY_STORE": REDIS_STORE,
            "CACHES": {"records": SHARED_CACHE},
            "IDEMPOTENCY_REDIS_CACHE": "records",
        },
        id="E019",
    ),
    pytest.param(E019, {"IDEMPOTENCY_REDIS_CACHE": "nowhere"}, id="E019-other-store"),
    pytest.param(
        E020, {"IDEMPOTENCY_STORE": REDIS_STORE, "CACHES": {"default": SHARED_CACHE}}, id="E020"
    ),
]


@pytest.mark.parametrize(("check_id", "overrides", "says"), FIRES)
def test_check_fires_on_its_misconfiguration(
    baseline: set[str], check_id: str, overrides: dict[str, Any], says: list[str]
) -> None:
    messages = ours(**overrides)

    [message] = [message for message in messages if message.id == check_id]
    assert message.level == (ERROR if check_id.split(".")[1].startswith("E") else WARNING)
    for text in says:
        assert text in message.msg
    assert message.hint
    assert {str(other.id) for other in messages} - {check_id} <= baseline


@pytest.mark.parametrize(("check_id", "overrides"), SILENT)
def test_check_is_silent_when_configured_right(
    baseline: set[str], check_id: str, overrides: dict[str, Any]
) -> None:
    ids = {str(message.id) for message in ours(**overrides)}

    assert check_id not in ids
    assert ids <= baseline - {check_id}


def test_test_settings_report_nothing_but_sqlite_in_deployment() -> None:
    on_sqlite = settings.DATABASES["default"]["ENGINE"].endswith("sqlite3")

    assert ours(deploy=False) == []
    assert {str(message.id) for message in ours()} == ({W002} if on_sqlite else set())


def test_deployment_checks_only_run_with_deploy() -> None:
    overrides = {"DATABASES": {"lite": SQLITE}, "IDEMPOTENCY_DATABASE": "lite"}

    ids = {message.id for message in ours(deploy=False, IDEMPOTENCY_ENABLED=False, **overrides)}

    assert not ids & DEPLOY_ONLY


def test_every_mistake_is_reported_at_once() -> None:
    ids = [
        message.id
        for message in ours(
            IDEMPOTENCY_MODE="atomc", IDEMPOTENCY_LEASE=-5, IDEMPOTENCY_HEADER="Idempotency Key"
        )
    ]

    assert {E002, E003, E005} <= set(ids)


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"DATABASE_ROUTERS": ["tests.test_checks.FailingRouter"]}, id="router"),
        pytest.param(
            {
                "DATABASES": {"legacy": {"ENGINE": "django.db.backends.mysql"}},
                "IDEMPOTENCY_DATABASE": "legacy",
            },
            id="driver-missing-or-mysql",
        ),
        pytest.param(
            {
                "CACHES": {"idempotency": {"BACKEND": "nowhere.Cache"}},
                "IDEMPOTENCY_CACHE": "idempotency",
            },
            id="cache-backend",
        ),
    ],
)
def test_what_cannot_be_determined_is_not_a_traceback(overrides: dict[str, Any]) -> None:
    # Our functions directly: Django's own cache check raises on a backend that cannot import.
    with configured(**overrides):
        messages = [*checks.check_settings(), *checks.check_deployment()]

    # A MySQL driver, when installed, is reported as unsupported; nothing else is an error.
    assert [message for message in messages if message.is_serious() and message.id != E012] == []


class BrokenInclude:
    """A URLconf that loads, with an include that does not: a module without urlpatterns."""

    urlpatterns = [
        path("atomic/", AtomicView.as_view()),
        path("broken/", include(types.ModuleType("no_urlpatterns"))),
    ]


@pytest.mark.parametrize(
    "urlconf", ["tests.no_such_urls", BrokenInclude], ids=["urlconf", "include"]
)
def test_a_urlconf_that_does_not_load_is_left_to_djangos_url_checks(urlconf: Any) -> None:
    # The store is lease-only, so the views are also searched for atomic mode (E018).
    with configured(
        ROOT_URLCONF=urlconf,
        IDEMPOTENCY_STORE=REDIS_STORE,
        IDEMPOTENCY_MODE="lease",
        CACHES={"default": SHARED_CACHE},
    ):
        messages = checks.check_views()

    # No traceback and nothing of ours about the URLconf: Django reports it when it loads it.
    # What did load is still checked.
    assert [message.id for message in messages] == ([E018] if urlconf is BrokenInclude else [])


@pytest.mark.parametrize("error", ["RuntimeError", "ImproperlyConfigured"])
def test_a_module_that_fails_to_import_is_reported_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: str
) -> None:
    (tmp_path / "broken_owners.py").write_text(
        "from django.core.exceptions import ImproperlyConfigured\n"
        f"raise {error}('GDAL is not installed')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    [message] = ours(deploy=False, IDEMPOTENCY_OWNER_RESOLVER="broken_owners.owner")

    assert message.id == E007
    assert message.msg == (
        "IDEMPOTENCY_OWNER_RESOLVER = 'broken_owners.owner' cannot be imported:"
        f" {error}('GDAL is not installed')"
    )


def test_manage_py_check_fails_naming_the_setting() -> None:
    with configured(IDEMPOTENCY_LEASE=0), pytest.raises(SystemCheckError) as error:
        call_command("check")

    assert "(django_idempotency.E002) IDEMPOTENCY_LEASE = 0" in str(error.value)


@pytest.mark.django_db  # Django 6 runs the database-tagged checks (W006) with the others.
def test_checks_can_be_run_on_their_own_by_tag() -> None:
    with configured(IDEMPOTENCY_MODE="atomc"):
        ids = {message.id for message in run_checks(tags=[checks.TAG])}

    assert ids == {E003}


def _declared_ids() -> list[str]:
    return [
        value for value in vars(checks).values() if isinstance(value, str) and ID.fullmatch(value)
    ]


def test_check_ids_are_unique_and_documented() -> None:
    source = "".join(path.read_text() for path in Path(checks.__file__).parent.glob("*.py"))
    declared = _declared_ids()
    documented = re.findall(r"^### `(django_idempotency\.[EW]\d{3})`", DOCS.read_text(), re.M)

    assert sorted(ID.findall(source)) == sorted(declared)  # Each id written once, in its constant.
    assert len(set(declared)) == len(declared)
    assert sorted(documented) == sorted(declared)


def test_every_id_has_a_firing_and_a_silent_test() -> None:
    declared = set(_declared_ids())

    assert {case.values[0] for case in FIRES} | DATABASE_ONLY == declared
    assert {case.values[0] for case in SILENT} | DATABASE_ONLY == declared


class BadAttributes:
    """A URLconf whose one view has every kind of attribute mistake."""

    class View(IdempotencyMixin, APIView):
        idempotency_ttl = -60
        idempotency_on_conflict = "block"
        idempotency_required = "yes"
        idempotency_exempt = "no"

    urlpatterns = [path("bad/", View.as_view())]


def test_every_invalid_view_attribute_is_reported() -> None:
    messages = [message.msg for message in ours(deploy=False, ROOT_URLCONF=BadAttributes)]

    assert messages == [
        "tests.test_checks.BadAttributes.View.idempotency_required = 'yes' (routed at 'bad/'):"
        " required must be True or False, not 'yes': a string is not read as a boolean"
        " (parse an environment variable yourself).",
        "tests.test_checks.BadAttributes.View.idempotency_ttl = -60 (routed at 'bad/'):"
        " ttl must be more than zero seconds, not -60.",
        "tests.test_checks.BadAttributes.View.idempotency_on_conflict = 'block' (routed at"
        " 'bad/'): on_conflict must be one of reject, wait; got 'block'.",
        "tests.test_checks.BadAttributes.View.idempotency_exempt = 'no' (routed at 'bad/'):"
        " idempotency_exempt must be True or False, not 'no': a string is not read as a"
        " boolean (parse an environment variable yourself).",
    ]


def test_the_encryption_keys_hint_names_the_environment_variable_the_docs_use() -> None:
    [message] = [m for m in ours(IDEMPOTENCY_ENCRYPTION_KEYS=[]) if m.id == E023]

    assert 'os.environ["IDEMPOTENCY_ENCRYPTION_KEY"]' in str(message.hint)


def test_a_string_boolean_stops_manage_py_check() -> None:
    with configured(IDEMPOTENCY_ENABLED="false"), pytest.raises(SystemCheckError) as error:
        call_command("check")

    assert "(django_idempotency.E015) IDEMPOTENCY_ENABLED must be True or False" in str(error.value)


def _database_messages() -> list[CheckMessage]:
    return [
        message
        for message in run_checks(databases=["default"], tags=["database"])
        if message.id in (W006, W007)
    ]


@pytest.mark.usefixtures("records_table_missing")
def test_a_forgotten_migrate_is_reported_by_check_database() -> None:
    [message] = _database_messages()

    assert message.level == WARNING
    assert message.msg == (
        "The table django_idempotency_record does not exist in the database 'default':"
        " run `python manage.py migrate django_idempotency`."
    )
    assert "500 store-misconfigured" in str(message.hint)


@pytest.mark.usefixtures("database_down")
def test_a_database_that_cannot_be_reached_is_not_reported_as_unmigrated() -> None:
    # Neither W006 nor W007 guesses: the connection's own error says what is wrong.
    from django_idempotency.checks.stores import check_database

    assert check_database(databases=["default"]) == []


@pytest.mark.django_db(transaction=True)
def test_an_unapplied_migration_is_reported_by_check_database() -> None:
    call_command("migrate", "django_idempotency", "0002", verbosity=0)
    try:
        [message] = _database_messages()
    finally:
        call_command("migrate", "django_idempotency", verbosity=0)

    assert message.id == W007
    assert message.level == WARNING
    assert message.msg == (
        "The database 'default' lacks migrations of django_idempotency:"
        " 0003_binary_scope_on_mariadb, 0004_decrypted_response_permission,"
        " 0005_record_steps, 0006_outbound_calls, 0007_operation_identity, 0008_outbox,"
        " 0009_recoverable_operations."
    )
    assert str(message.hint).startswith("Run `python manage.py migrate django_idempotency`")


@pytest.mark.django_db(transaction=True)
def test_migrate_on_a_fresh_database_does_not_tell_to_run_migrate() -> None:
    # migrate runs the database checks before it applies the migrations: W006 and W007 would
    # tell whoever is running migrate to run it.
    call_command("migrate", "django_idempotency", "zero", verbosity=0)
    said = io.StringIO()
    try:
        call_command("migrate", "django_idempotency", skip_checks=False, stdout=said, stderr=said)
    finally:
        call_command("migrate", "django_idempotency", verbosity=0)

    assert "W006" not in said.getvalue() and "W007" not in said.getvalue(), said.getvalue()
    assert "Applying django_idempotency.0009_recoverable_operations... OK" in said.getvalue()
    assert _database_messages() == []


@pytest.mark.django_db
def test_a_migrated_database_passes_check_database() -> None:
    assert _database_messages() == []


def test_the_table_is_looked_for_only_in_a_named_database_of_the_database_store() -> None:
    # No database access here: neither call may query one.
    assert checks.check_database() == []
    with configured(IDEMPOTENCY_STORE="tests.test_checks.MemoryStore"):
        assert checks.check_database(databases=["default"]) == []


def _runserver_start() -> str:
    """What runserver prints about migrations as it starts, before it serves."""
    from django.core.management.commands.runserver import Command as Runserver

    stdout = StringIO()
    Runserver(stdout=stdout, no_color=True).check_migrations()
    return stdout.getvalue()


@pytest.mark.django_db(databases=["default", "records"], transaction=True)
def test_runserver_warns_of_a_migration_missing_on_the_records_database() -> None:
    with configured(IDEMPOTENCY_DATABASE="records"):
        call_command("migrate", "django_idempotency", "0002", database="records", verbosity=0)
        try:
            lacking = _runserver_start()
        finally:
            call_command("migrate", "django_idempotency", database="records", verbosity=0)
        migrated = _runserver_start()

    assert lacking == (
        "\n?: (django_idempotency.W007) The database 'records' lacks migrations of"
        " django_idempotency: 0003_binary_scope_on_mariadb, 0004_decrypted_response_permission,"
        " 0005_record_steps, 0006_outbound_calls, 0007_operation_identity, 0008_outbox,"
        " 0009_recoverable_operations."
        "\n\tHINT: Run `python manage.py migrate django_idempotency --database records`: the"
        " store's statements expect the schema of the last migration.\n"
    )
    assert migrated == ""
