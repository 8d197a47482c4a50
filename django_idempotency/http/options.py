"""Per-view options: decorator arguments, then the view's class attributes, then settings."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

from django.core.exceptions import ImproperlyConfigured

from django_idempotency.conf import (
    MODES,
    ON_CONFLICT,
    Mode,
    OnConflict,
    check_options,
    choice,
    conf,
    to_bool,
    to_timedelta,
)

# A view's class attributes and the option each stands in for.
VIEW_ATTRIBUTES = {
    "idempotency_required": "required",
    "idempotency_ttl": "ttl",
    "idempotency_mode": "mode",
    "idempotency_on_conflict": "on_conflict",
    "idempotency_namespace": "namespace",
    "idempotency_header": "header",
}


@dataclass(frozen=True)
class Options:
    """What a decorator or view asked for; None means "inherit"."""

    required: bool | None = None
    ttl: timedelta | float | None = None
    mode: Mode | None = None
    on_conflict: OnConflict | None = None
    namespace: str | None = None
    header: str | None = None
    verify: Callable[[Any], None] | None = None

    def __post_init__(self) -> None:
        check_options(
            self.mode,
            self.on_conflict,
            self.ttl,
            namespace=self.namespace,
            header=self.header,
            required=self.required,
        )


@dataclass(frozen=True)
class Resolved:
    """The options in force for one request."""

    required: bool
    ttl: timedelta
    mode: Mode
    on_conflict: OnConflict
    namespace: str
    header: str
    verify: Callable[[Any], None] | None


def resolve(options: Options, view: Any) -> Resolved:
    def pick(name: str, attribute: str) -> Any:
        value = getattr(options, name)
        if value is None and view is not None:
            value = getattr(view, attribute, None)
        return value

    ttl = pick("ttl", "idempotency_ttl")
    return Resolved(
        required=_or(pick("required", "idempotency_required"), conf.REQUIRED),
        ttl=conf.TTL if ttl is None else to_timedelta(ttl, "idempotency_ttl"),
        mode=cast(Mode, choice(_or(pick("mode", "idempotency_mode"), conf.MODE), MODES, "mode")),
        on_conflict=cast(
            OnConflict,
            choice(
                _or(pick("on_conflict", "idempotency_on_conflict"), conf.ON_CONFLICT),
                ON_CONFLICT,
                "on_conflict",
            ),
        ),
        namespace=_or(pick("namespace", "idempotency_namespace"), conf.NAMESPACE),
        header=_or(pick("header", "idempotency_header"), conf.HEADER),
        verify=pick("verify", "idempotency_verify"),
    )


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def is_exempt(*views: Any) -> bool:
    """Whether any of these (view, handler, URL callback) opted out of the project-wide guard."""
    return any(
        to_bool(getattr(view, "idempotency_exempt", False), "idempotency_exempt") for view in views
    )


def attribute_errors(view: Any) -> Iterator[tuple[str, Any, str]]:
    """(attribute, value, why) for each ``idempotency_*`` attribute a request would refuse.

    The same validation as the decorator's options, so `manage.py check` reports what the first
    request would otherwise fail on.
    """
    for attribute, option in VIEW_ATTRIBUTES.items():
        value = getattr(view, attribute, None)
        if value is None:
            continue
        try:
            Options(**{option: value})
        except ImproperlyConfigured as exc:
            yield attribute, value, str(exc)
    try:
        is_exempt(view)
    except ImproperlyConfigured as exc:
        yield "idempotency_exempt", view.idempotency_exempt, str(exc)
