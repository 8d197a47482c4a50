"""The per-view options, declared once: the table decorator, views, settings and checks share."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from django.core.exceptions import ImproperlyConfigured

from django_idempotency.core.keys import MAX_NAMESPACE_LENGTH

Mode = Literal["atomic", "lease"]
OnConflict = Literal["reject", "wait"]
# What becomes of a response that is a credential (a token, a session): given back, or kept.
Credentials = Literal["release", "store"]
MODES: tuple[Mode, ...] = ("atomic", "lease")
ON_CONFLICT: tuple[OnConflict, ...] = ("reject", "wait")
CREDENTIALS: tuple[Credentials, ...] = ("release", "store")
# An RFC 9110 field-name: a token of visible ASCII letters, digits and these symbols.
HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_NO_TIME = timedelta(0)  # Built once: a view's ttl is checked on every request.


def to_timedelta(value: timedelta | float, name: str) -> timedelta:
    """Durations are a `timedelta` or a number of seconds."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return timedelta(seconds=value)
    raise ImproperlyConfigured(f"{name} must be a timedelta or a number of seconds, not {value!r}.")


def to_bool(value: Any, name: str) -> bool:
    """A switch must be True or False: `bool("false")` is True, the surprise this prevents."""
    if isinstance(value, bool):
        return value
    raise ImproperlyConfigured(
        f"{name} must be True or False, not {value!r}"
        + (
            ": a string is not read as a boolean (parse an environment variable yourself)."
            if isinstance(value, str)
            else "."
        )
    )


def choice(value: str, allowed: tuple[str, ...], name: str) -> str:
    if value not in allowed:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(allowed)}; got {value!r}.")
    return value


def _required(value: Any) -> bool:
    return to_bool(value, "required")


def _ttl(value: Any) -> timedelta:
    ttl = to_timedelta(value, "ttl")
    if ttl <= _NO_TIME:
        # Every record would expire as it is claimed, and each retry would run the view again.
        raise ImproperlyConfigured(f"ttl must be more than zero seconds, not {value!r}.")
    return ttl


def _lease(value: Any) -> timedelta:
    lease = to_timedelta(value, "lease")
    if lease <= _NO_TIME:
        # Every claim would be abandoned as it is made: any duplicate would run the work again.
        raise ImproperlyConfigured(f"lease must be more than zero seconds, not {value!r}.")
    return lease


def _mode(value: Any) -> str:
    return choice(value, MODES, "mode")


def _on_conflict(value: Any) -> str:
    return choice(value, ON_CONFLICT, "on_conflict")


def _credentials(value: Any) -> str:
    return choice(value, CREDENTIALS, "credentials")


def _namespace(value: Any) -> str:
    if isinstance(value, str) and len(value) <= MAX_NAMESPACE_LENGTH:
        return value
    raise ImproperlyConfigured(
        f"namespace must be a string of at most {MAX_NAMESPACE_LENGTH} characters, not {value!r}."
    )


def _header(value: Any) -> str:
    if isinstance(value, str) and HEADER_NAME.fullmatch(value):
        return value
    # A name no client can send would make every key silently missing.
    raise ImproperlyConfigured(
        f"header {value!r} is not an HTTP header name: use letters, digits and - "
        "(e.g. Idempotency-Key, webhook-id)."
    )


def _verify(value: Any) -> Callable[[Any], None]:
    if callable(value):
        return value  # type: ignore[no-any-return]
    raise ImproperlyConfigured(
        f"verify must be a callable taking the request (e.g. StandardWebhooks), not {value!r}."
    )


@dataclass(frozen=True)
class Option:
    """One per-view option and every place a value for it may come from."""

    name: str  # The @idempotent keyword argument.
    setting: str | None  # The IDEMPOTENCY_* setting used when nothing else sets it.
    default: Any  # The setting's value when the project leaves it out (the option's, if none).
    # Returns a valid value normalised (seconds to a timedelta); raises ImproperlyConfigured.
    check: Callable[[Any], Any]
    attribute: str = field(init=False)  # The view's class attribute.
    hook: str = field(init=False)  # The view's method returning the value for one request.

    def __post_init__(self) -> None:
        object.__setattr__(self, "attribute", f"idempotency_{self.name}")
        object.__setattr__(self, "hook", f"get_idempotency_{self.name}")


# In the order of @idempotent's keyword arguments, which a test holds to this table.
OPTIONS: tuple[Option, ...] = (
    Option("required", setting="IDEMPOTENCY_REQUIRED", default=False, check=_required),
    Option("ttl", setting="IDEMPOTENCY_TTL", default=timedelta(hours=24), check=_ttl),
    Option("lease", setting="IDEMPOTENCY_LEASE", default=timedelta(seconds=60), check=_lease),
    Option("mode", setting="IDEMPOTENCY_MODE", default="atomic", check=_mode),
    Option("on_conflict", setting="IDEMPOTENCY_ON_CONFLICT", default="reject", check=_on_conflict),
    Option("namespace", setting="IDEMPOTENCY_NAMESPACE", default="default", check=_namespace),
    Option("header", setting="IDEMPOTENCY_HEADER", default="Idempotency-Key", check=_header),
    Option("verify", setting=None, default=None, check=_verify),
    # None: "release" for the views of `http.exempt.CREDENTIAL_VIEWS`, the others store.
    Option("credentials", setting=None, default=None, check=_credentials),
)
OPTION = {option.name: option for option in OPTIONS}


def check_options(**values: Any) -> dict[str, Any]:
    """The options given (None means "not set") checked and normalised, by name.

    Run when a decorator is applied, so a bad value fails at import, not on the first request.
    """
    return {name: OPTION[name].check(value) for name, value in values.items() if value is not None}
