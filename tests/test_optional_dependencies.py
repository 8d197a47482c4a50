"""Django alone is enough: DRF, Celery, django-redis, drf-spectacular and the rest stay optional.

The `base` tox env runs this module (with the plain-Django test modules) where none of them is
installed; every other env runs it too, hiding them from a fresh interpreter. The module is also
the URLconf of `tests.settings_base`, which has no DRF.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from django.contrib import admin
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.views import View

import tests
from django_idempotency import idempotent
from tests.models import Charge
from tests.utils import assert_problem, post

# Top-level modules of the optional extras (and of what they pull in).
OPTIONAL_MODULES = (
    "rest_framework",
    "celery",
    "kombu",
    "django_redis",
    "redis",
    "drf_spectacular",
    "prometheus_client",
    "standardwebhooks",
    "cryptography",
    "opentelemetry",
    "ninja",
    "httpx",
    "requests",
)
# Modules outside contrib that need an extra (the outbound client's transports): each is
# probed as a contrib package is.
NEEDS_EXTRA = {
    "django_idempotency.outbound.transport": "httpx",
    "django_idempotency.outbound.adapter": "requests",
}

# Runs in a fresh interpreter: None in sys.modules makes `import x` raise ModuleNotFoundError and
# importlib.util.find_spec(x) return None, exactly as if x were not installed.
PROBE = textwrap.dedent(
    """
    import importlib, json, pkgutil, sys

    OPTIONAL = {optional!r}
    NEEDS_EXTRA = {needs_extra!r}
    for name in OPTIONAL:
        sys.modules[name] = None

    import django
    from django.core.management import call_command

    django.setup()

    import django_idempotency
    import django_idempotency.contrib


    def walk(package):
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            if info.name == "django_idempotency.contrib" or info.name in NEEDS_EXTRA:
                continue  # Each contrib package may need its framework: probed below.
            module = importlib.import_module(info.name)
            yield info.name
            if info.ispkg:
                yield from walk(module)


    imported = sorted(walk(django_idempotency))
    contrib = {{}}
    for info in pkgutil.iter_modules(django_idempotency.contrib.__path__):
        name = "django_idempotency.contrib." + info.name
        try:
            importlib.import_module(name)
        except ImportError as exc:
            contrib[name] = {{"error": type(exc).__name__, "name": exc.name, "message": str(exc)}}
        else:
            contrib[name] = None
    # A module of a contrib package that needs the framework its package does not, and the
    # modules elsewhere that need an extra.
    for name in ["django_idempotency.contrib.rest_framework.errors", *NEEDS_EXTRA]:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            contrib[name] = {{"error": type(exc).__name__, "name": exc.name, "message": str(exc)}}
    # What the package exports in place of a transport that is not there: the same error.
    import django_idempotency.outbound as outbound

    try:
        outbound.IdempotentTransport
    except ImportError as exc:
        contrib["outbound.IdempotentTransport"] = {{
            "error": type(exc).__name__, "name": exc.name, "message": str(exc)
        }}
    call_command("check", fail_level="ERROR")

    from django_idempotency import tasks

    print(json.dumps({{
        "imported": imported,
        "contrib": contrib,
        "celery_task_defined": hasattr(tasks, "purge_expired_records"),
        "loaded": sorted(name for name in OPTIONAL if sys.modules.get(name) is not None),
    }}))
    """
).format(optional=OPTIONAL_MODULES, needs_extra=NEEDS_EXTRA)


@pytest.fixture(scope="module")
def probe() -> dict[str, Any]:
    """Import the whole package, and run the system checks, with every optional module hidden."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings_base",
        # Where `tests` lives, so the child imports the same package as this process.
        "PYTHONPATH": str(Path(tests.__file__).resolve().parent.parent),
    }
    result = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def test_every_module_outside_contrib_imports_without_optional_dependencies(
    probe: dict[str, Any],
) -> None:
    expected = {
        "django_idempotency.admin",
        "django_idempotency.conf",
        "django_idempotency.decorators",
        "django_idempotency.models",
        "django_idempotency.purge",
        "django_idempotency.tasks",
        "django_idempotency.http.guard",
        "django_idempotency.stores.cache",
        "django_idempotency.stores.database",
        "django_idempotency.management.commands.idempotency_purge",
        "django_idempotency.migrations.0001_initial",
        "django_idempotency.outbound",
        "django_idempotency.outbound.calls",
        "django_idempotency.outbound.journal",
        "django_idempotency.outbound.policy",
    }
    assert expected <= set(probe["imported"])
    assert probe["loaded"] == []


def test_encryption_keys_without_cryptography_say_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django.core.exceptions import ImproperlyConfigured
    from django.test import override_settings

    from django_idempotency.conf import conf

    monkeypatch.setitem(sys.modules, "cryptography.fernet", None)  # As if not installed.
    with (
        override_settings(IDEMPOTENCY_ENCRYPTION_KEYS=["a key"]),
        pytest.raises(ImproperlyConfigured, match=r"django-idempotency\[encryption\]"),
    ):
        assert conf.ENCRYPTION_KEYS is None  # Not reached: reading the setting raises.


def test_the_celery_task_is_not_defined_without_celery(probe: dict[str, Any]) -> None:
    assert probe["celery_task_defined"] is False


def test_the_tasks_module_imports_without_celery_leaving_the_task_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # In this process, as a project without Celery imports it (the beat schedule's module).
    import django_idempotency
    import django_idempotency.tasks

    monkeypatch.setitem(sys.modules, "celery", None)
    monkeypatch.delitem(sys.modules, "django_idempotency.tasks")
    monkeypatch.setattr(django_idempotency, "tasks", django_idempotency.tasks)

    tasks = importlib.import_module("django_idempotency.tasks")

    assert not hasattr(tasks, "purge_expired_records")
    assert tasks.retry_countdown(0) == tasks.RETRY_DELAY


def test_rest_framework_mixin_imports_without_drf(probe: dict[str, Any]) -> None:
    # The mixin only overrides DRF hooks by name; nothing is imported from DRF until a view
    # class built on it is used, so a project without DRF can still import the package.
    assert probe["contrib"]["django_idempotency.contrib.rest_framework"] is None


def test_contrib_packages_fail_only_for_their_missing_dependency(probe: dict[str, Any]) -> None:
    for name, failure in probe["contrib"].items():
        if failure is not None:
            assert failure["error"] == "ModuleNotFoundError", (name, failure)
            assert failure["name"].partition(".")[0] in OPTIONAL_MODULES, (name, failure)


@pytest.mark.parametrize(
    ("module", "extra"),
    [
        ("celery", "celery"),
        ("prometheus", "prometheus"),
        ("drf_spectacular", "spectacular"),
        ("rest_framework.errors", "drf"),
        ("redis_cluster", "redis"),
        ("opentelemetry", "otel"),
        ("ninja", "ninja"),
    ],
)
def test_a_contrib_module_without_its_extra_names_the_extra_to_install(
    probe: dict[str, Any], module: str, extra: str
) -> None:
    failure = probe["contrib"][f"django_idempotency.contrib.{module}"]

    assert failure["error"] == "ModuleNotFoundError"
    assert failure["message"].endswith(
        f': install it with pip install "django-idempotency[{extra}]"'
    )


@pytest.mark.parametrize(("module", "extra"), list(NEEDS_EXTRA.items()))
def test_an_outbound_transport_without_its_extra_names_the_extra_to_install(
    probe: dict[str, Any], module: str, extra: str
) -> None:
    failure = probe["contrib"][module]

    assert failure["error"] == "ModuleNotFoundError"
    assert failure["name"] == extra
    assert failure["message"].endswith(
        f': install it with pip install "django-idempotency[{extra}]"'
    )


def test_the_outbound_client_names_its_extra_when_its_transport_is_used(
    probe: dict[str, Any],
) -> None:
    # `from django_idempotency.outbound import IdempotentTransport` without httpx.
    assert probe["contrib"]["outbound.IdempotentTransport"]["message"].endswith(
        ': install it with pip install "django-idempotency[httpx]"'
    )


# Plain Django views, as a project without DRF writes them.


@idempotent(required=True)
def create_charge(request: HttpRequest) -> HttpResponse:
    payload = json.loads(request.body)
    charge = Charge.objects.create(reference=payload["reference"], amount=payload["amount"])
    response = JsonResponse({"id": charge.pk, "amount": charge.amount}, status=201)
    response["Location"] = f"/plain/charges/{charge.pk}/"
    return response


class ChargeView(View):
    @idempotent(namespace="plain-cbv")
    def post(self, request: HttpRequest) -> HttpResponse:
        payload = json.loads(request.body)
        charge = Charge.objects.create(reference=payload["reference"], amount=payload["amount"])
        return JsonResponse({"id": charge.pk}, status=201)


urlpatterns = [
    path("admin/", admin.site.urls),
    path("plain/charges/", create_charge),
    path("plain/cbv/charges/", ChargeView.as_view()),
]

plain_views = pytest.mark.urls(__name__)


@plain_views
@pytest.mark.django_db
@pytest.mark.parametrize("url", ["/plain/charges/", "/plain/cbv/charges/"])
def test_a_retry_of_a_plain_django_view_is_replayed(client: Any, url: str) -> None:
    body = {"reference": "order-1", "amount": 10}
    first = post(client, url, body, key="plain-1")
    retry = post(client, url, body, key="plain-1")

    assert first.status_code == 201
    assert retry.status_code == 201
    assert retry.content == first.content
    assert retry["Idempotent-Replayed"] == "true"
    assert Charge.objects.count() == 1


@plain_views
@pytest.mark.django_db
def test_a_plain_django_view_keeps_its_headers_on_replay(client: Any) -> None:
    body = {"reference": "order-1", "amount": 10}
    first = post(client, "/plain/charges/", body, key="plain-1")
    retry = post(client, "/plain/charges/", body, key="plain-1")

    assert retry["Location"] == first["Location"]


@plain_views
@pytest.mark.django_db
def test_a_plain_django_view_answers_problems(client: Any) -> None:
    body = {"reference": "order-1", "amount": 10}
    assert_problem(post(client, "/plain/charges/", body, key=None), 400, "missing-key")
    post(client, "/plain/charges/", body, key="plain-1")
    other = {"reference": "order-2", "amount": 20}
    assert_problem(post(client, "/plain/charges/", other, key="plain-1"), 422, "key-reused")
    assert Charge.objects.count() == 1


@pytest.mark.parametrize(
    ("module", "blocked", "extra"),
    [
        ("celery", "celery", "celery"),
        ("prometheus", "prometheus_client", "prometheus"),
        ("drf_spectacular", "drf_spectacular", "spectacular"),
        ("rest_framework.errors", "rest_framework.exceptions", "drf"),
        ("ninja", "ninja.errors", "ninja"),
        ("opentelemetry", "opentelemetry", "otel"),
        # Marked redis: needs django-redis installed (the base env has not), redis-py's cluster
        # module being what goes missing.
        pytest.param("redis_cluster", "redis.cluster", "redis", marks=pytest.mark.redis),
    ],
)
def test_the_extra_is_named_where_the_dependency_is_installed_but_cannot_be_imported(
    monkeypatch: pytest.MonkeyPatch, module: str, blocked: str, extra: str
) -> None:
    # The same message in this process, with the dependency made unimportable (None in
    # sys.modules), as when a deployment forgot the extra.
    monkeypatch.setitem(sys.modules, blocked, None)
    contrib = f"django_idempotency.contrib.{module}"
    for name in [name for name in sys.modules if name == contrib or name.startswith(contrib + ".")]:
        monkeypatch.delitem(sys.modules, name)

    with pytest.raises(ModuleNotFoundError) as error:
        importlib.import_module(contrib)

    assert str(error.value).endswith(f': install it with pip install "django-idempotency[{extra}]"')
    assert error.value.name == blocked
