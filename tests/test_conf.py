"""Settings: every IDEMPOTENCY_* default, live overrides, and errors that name the setting."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from django.test import override_settings

from django_idempotency import conf as conf_module
from django_idempotency.conf import conf, to_timedelta
from django_idempotency.http.options import Options
from django_idempotency.http.owners import authenticated_user
from django_idempotency.http.requests import request_fingerprint

DURATIONS = ["TTL", "LEASE", "WAIT_TIMEOUT"]


def tenant_owner(request: HttpRequest) -> str:
    """An owner resolver given to IDEMPOTENCY_OWNER_RESOLVER as a callable."""
    return "tenant-1"


@pytest.fixture
def no_idempotency_settings() -> Iterator[None]:
    """Remove every IDEMPOTENCY_* setting (tests/settings.py sets some) to see the defaults."""
    with override_settings():
        for name in [name for name in dir(settings) if name.startswith("IDEMPOTENCY_")]:
            delattr(settings, name)
        conf.reload()  # Deleting a setting sends no setting_changed.
        yield
    conf.reload()


@pytest.mark.usefixtures("no_idempotency_settings")
@pytest.mark.parametrize(
    ("attribute", "default"),
    [
        ("ENABLED", True),
        ("HEADER", "Idempotency-Key"),
        ("METHODS", ("POST", "PATCH")),
        ("REQUIRED", False),
        ("TTL", timedelta(hours=24)),
        ("MODE", "atomic"),
        ("ON_CONFLICT", "reject"),
        ("LEASE", timedelta(seconds=60)),
        ("WAIT_TIMEOUT", timedelta(seconds=10)),
        ("NAMESPACE", "default"),
        ("KEY_FORMAT", None),
        ("OWNER_RESOLVER", authenticated_user),
        ("FINGERPRINT", request_fingerprint),
        ("FINGERPRINT_IGNORE_FIELDS", frozenset()),
        ("STORED_CLIENT_ERRORS", {402}),
        ("STORE_SERVER_ERRORS", False),
        ("STORE", "django_idempotency.stores.database.DatabaseStore"),
        ("DATABASE", None),
        ("MAX_STORED_BYTES", 1024 * 1024),
        ("ERROR_FORMAT", "problem"),
        ("GUARD_ALL_VIEWS", False),
        ("ADMIN", True),
        ("TRACING", True),
        (
            "PROBLEM_BASE_URL",
            "tag:django-idempotency.github.io,2026:",
        ),
        (
            "DOCS_URL",
            "https://github.com/django-idempotency/django-idempotency/blob/main/docs/errors.md",
        ),
    ],
)
def test_unset_setting_has_its_documented_default(attribute: str, default: Any) -> None:
    assert getattr(conf, attribute) == default


def test_test_settings_wait_timeout_is_read_from_django_settings() -> None:
    wait_timeout = conf.WAIT_TIMEOUT

    assert wait_timeout == timedelta(seconds=settings.IDEMPOTENCY_WAIT_TIMEOUT)


@pytest.mark.parametrize(
    ("setting", "value", "attribute", "expected"),
    [
        ("IDEMPOTENCY_ENABLED", False, "ENABLED", False),
        ("IDEMPOTENCY_HEADER", "X-Request-Id", "HEADER", "X-Request-Id"),
        ("IDEMPOTENCY_METHODS", ["post", "Put"], "METHODS", ("POST", "PUT")),
        ("IDEMPOTENCY_REQUIRED", True, "REQUIRED", True),
        ("IDEMPOTENCY_TTL", timedelta(days=7), "TTL", timedelta(days=7)),
        ("IDEMPOTENCY_MODE", "lease", "MODE", "lease"),
        ("IDEMPOTENCY_ON_CONFLICT", "wait", "ON_CONFLICT", "wait"),
        ("IDEMPOTENCY_LEASE", 5, "LEASE", timedelta(seconds=5)),
        ("IDEMPOTENCY_WAIT_TIMEOUT", 0.5, "WAIT_TIMEOUT", timedelta(milliseconds=500)),
        ("IDEMPOTENCY_NAMESPACE", "payments", "NAMESPACE", "payments"),
        ("IDEMPOTENCY_KEY_FORMAT", "uuid", "KEY_FORMAT", "uuid"),
        ("IDEMPOTENCY_OWNER_RESOLVER", tenant_owner, "OWNER_RESOLVER", tenant_owner),
        (
            "IDEMPOTENCY_FINGERPRINT_IGNORE_FIELDS",
            ["nonce"],
            "FINGERPRINT_IGNORE_FIELDS",
            {"nonce"},
        ),
        ("IDEMPOTENCY_STORED_CLIENT_ERRORS", [402, 409], "STORED_CLIENT_ERRORS", {402, 409}),
        ("IDEMPOTENCY_STORE_SERVER_ERRORS", True, "STORE_SERVER_ERRORS", True),
        ("IDEMPOTENCY_STORE", "myproject.Store", "STORE", "myproject.Store"),
        ("IDEMPOTENCY_DATABASE", "replica", "DATABASE", "replica"),
        (
            "IDEMPOTENCY_PROBLEM_BASE_URL",
            "https://x.test/#",
            "PROBLEM_BASE_URL",
            "https://x.test/#",
        ),
        ("IDEMPOTENCY_DOCS_URL", "https://x.test/errors", "DOCS_URL", "https://x.test/errors"),
        ("IDEMPOTENCY_DOCS_URL", None, "DOCS_URL", None),
        ("IDEMPOTENCY_TRACING", False, "TRACING", False),
    ],
)
def test_override_settings_applies_on_every_access(
    setting: str, value: Any, attribute: str, expected: Any
) -> None:
    before = getattr(conf, attribute)

    with override_settings(**{setting: value}):
        assert getattr(conf, attribute) == expected
        assert getattr(conf, attribute) == expected

    assert getattr(conf, attribute) == before


def test_nested_overrides_are_each_seen() -> None:
    seen = []
    with override_settings(IDEMPOTENCY_TTL=60):
        seen.append(conf.TTL)
        with override_settings(IDEMPOTENCY_TTL=120):
            seen.append(conf.TTL)
        seen.append(conf.TTL)

    assert seen == [timedelta(minutes=1), timedelta(minutes=2), timedelta(minutes=1)]


def test_settings_are_read_once_until_a_setting_changes() -> None:
    """Requests do not pay for settings look-ups: a value is kept until setting_changed."""
    with override_settings(IDEMPOTENCY_NAMESPACE="first"):
        assert conf.NAMESPACE == "first"
        settings.IDEMPOTENCY_NAMESPACE = "second"  # Changed behind Django's back: no signal.
        assert conf.NAMESPACE == "first"
        with override_settings(IDEMPOTENCY_HEADER="X-Other"):  # Any IDEMPOTENCY_* change.
            assert conf.NAMESPACE == "second"


# Durations


@pytest.mark.parametrize("attribute", DURATIONS)
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (timedelta(minutes=5), timedelta(minutes=5)),
        (300, timedelta(minutes=5)),
        (1.5, timedelta(seconds=1.5)),
        (0, timedelta(0)),
    ],
)
def test_durations_accept_timedeltas_and_numbers_of_seconds(
    attribute: str, value: timedelta | float, expected: timedelta
) -> None:
    with override_settings(**{f"IDEMPOTENCY_{attribute}": value}):
        assert getattr(conf, attribute) == expected


@pytest.mark.parametrize("attribute", DURATIONS)
@pytest.mark.parametrize("value", [True, False, "60", "1h", None, [60]])
def test_durations_reject_other_values_naming_the_setting(attribute: str, value: Any) -> None:
    setting = f"IDEMPOTENCY_{attribute}"
    with (
        override_settings(**{setting: value}),
        pytest.raises(
            ImproperlyConfigured, match=f"{setting} must be a timedelta or a number of seconds"
        ),
    ):
        getattr(conf, attribute)


def test_to_timedelta_converts_seconds() -> None:
    assert to_timedelta(90, "ttl") == timedelta(minutes=1, seconds=30)
    assert to_timedelta(0.25, "ttl") == timedelta(milliseconds=250)
    assert to_timedelta(timedelta(hours=1), "ttl") == timedelta(hours=1)


@pytest.mark.parametrize("value", [True, "10", None])
def test_to_timedelta_rejects_non_numbers_naming_the_value(value: Any) -> None:
    with pytest.raises(ImproperlyConfigured, match=f"my_ttl must be .* not {value!r}"):
        to_timedelta(value, "my_ttl")


# Choices


@pytest.mark.parametrize(
    ("attribute", "allowed"),
    [
        ("MODE", ["atomic", "lease"]),
        ("ON_CONFLICT", ["reject", "wait"]),
        ("KEY_FORMAT", ["uuid", "ulid", "uuid_or_ulid"]),
    ],
)
def test_every_allowed_choice_is_accepted(attribute: str, allowed: list[str]) -> None:
    for value in allowed:
        with override_settings(**{f"IDEMPOTENCY_{attribute}": value}):
            assert getattr(conf, attribute) == value


@pytest.mark.parametrize(
    ("attribute", "allowed"),
    [
        ("MODE", "atomic, lease"),
        ("ON_CONFLICT", "reject, wait"),
        ("KEY_FORMAT", "uuid, ulid, uuid_or_ulid"),
    ],
)
@pytest.mark.parametrize("value", ["bogus", "ATOMIC", ""])
def test_unknown_choice_is_rejected_naming_the_allowed_values(
    attribute: str, allowed: str, value: str
) -> None:
    setting = f"IDEMPOTENCY_{attribute}"
    with (
        override_settings(**{setting: value}),
        pytest.raises(ImproperlyConfigured, match=f"{setting} must be one of {allowed}; got"),
    ):
        getattr(conf, attribute)


# Callables


def test_owner_resolver_accepts_a_callable_directly() -> None:
    with override_settings(IDEMPOTENCY_OWNER_RESOLVER=tenant_owner):
        assert conf.OWNER_RESOLVER is tenant_owner
        assert conf.OWNER_RESOLVER(HttpRequest()) == "tenant-1"


def test_owner_resolver_accepts_a_dotted_path() -> None:
    with override_settings(IDEMPOTENCY_OWNER_RESOLVER="tests.test_conf.tenant_owner"):
        assert conf.OWNER_RESOLVER is tenant_owner


@pytest.mark.parametrize(
    "path",
    [
        "tests.no_such_module.resolver",
        "django_idempotency.http.owners.no_such_function",
        "not-a-dotted-path",
    ],
)
@pytest.mark.parametrize("setting", ["OWNER_RESOLVER", "FINGERPRINT"])
def test_unimportable_dotted_path_is_improperly_configured(setting: str, path: str) -> None:
    name = f"IDEMPOTENCY_{setting}"
    with (
        override_settings(**{name: path}),
        pytest.raises(ImproperlyConfigured, match=f"{name} = '{path}' cannot be imported"),
    ):
        getattr(conf, setting)


# Per-view options


def test_options_with_an_unknown_mode_fail_at_construction() -> None:
    with pytest.raises(
        ImproperlyConfigured, match="mode must be one of atomic, lease; got 'bogus'"
    ):
        Options(mode="bogus")  # type: ignore[arg-type]


def test_options_with_an_unknown_on_conflict_fail_at_construction() -> None:
    with pytest.raises(ImproperlyConfigured, match="on_conflict must be one of reject, wait"):
        Options(on_conflict="retry")  # type: ignore[arg-type]


@pytest.mark.parametrize("ttl", ["1h", True])
def test_options_with_a_ttl_that_is_not_a_duration_fail_at_construction(ttl: Any) -> None:
    with pytest.raises(ImproperlyConfigured, match="ttl must be a timedelta or a number"):
        Options(ttl=ttl)


@pytest.mark.parametrize("header", ["Idempotency Key", "Idempotency-Key:", "", "clé"])
def test_options_with_a_header_no_client_can_send_fail_at_construction(header: str) -> None:
    with pytest.raises(ImproperlyConfigured, match="is not an HTTP header name"):
        Options(header=header)


def test_options_with_a_namespace_longer_than_its_column_fail_at_construction() -> None:
    with pytest.raises(ImproperlyConfigured, match="namespace must be a string of at most 100"):
        Options(namespace="n" * 101)


def test_valid_options_construct() -> None:
    options = Options(mode="lease", on_conflict="wait", ttl=60, namespace="refunds")

    assert (options.mode, options.on_conflict, options.ttl) == ("lease", "wait", 60)


def test_dotted_paths_are_imported_once_not_on_every_request() -> None:
    with override_settings(
        IDEMPOTENCY_OWNER_RESOLVER="django_idempotency.http.owners.authenticated_user"
    ):
        first = conf.OWNER_RESOLVER
        imports = conf_module._imported.cache_info().misses

        assert all(conf.OWNER_RESOLVER is first for _ in range(3))
        assert conf_module._imported.cache_info().misses == imports

    with override_settings(IDEMPOTENCY_OWNER_RESOLVER="tests.test_conf.a_resolver"):
        assert conf.OWNER_RESOLVER is a_resolver  # The setting is still read on each use.


def a_resolver(request: Any) -> str:
    return "tenant"


@pytest.mark.parametrize("value", ["", 42])
def test_a_docs_url_that_is_no_address_is_refused_saying_what_to_set(value: Any) -> None:
    with (
        override_settings(IDEMPOTENCY_DOCS_URL=value),
        pytest.raises(ImproperlyConfigured, match="IDEMPOTENCY_DOCS_URL must be the address"),
    ):
        conf.DOCS_URL  # noqa: B018
