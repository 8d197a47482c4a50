"""Per-view options: the decorator's argument, then the view's hook, attribute, then the setting."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from django_idempotency.conf import conf
from django_idempotency.options import (
    OPTIONS,
    Credentials,
    Mode,
    OnConflict,
    check_options,
    to_bool,
)

# A view's class attributes and the option each stands in for.
VIEW_ATTRIBUTES = {option.attribute: option.name for option in OPTIONS}

# Per option: the view's hook and attribute, the check of a value from either, and the `conf`
# attribute of the setting it falls back to (None: its default instead).
_SOURCES = {
    option.name: (
        option.hook,
        option.attribute,
        option.check,
        option.setting and option.setting.removeprefix("IDEMPOTENCY_"),
        option.default,
    )
    for option in OPTIONS
}


@dataclass(frozen=True)
class Options:
    """What a decorator or view asked for; None means "inherit"."""

    required: bool | None = None
    ttl: timedelta | float | None = None
    lease: timedelta | float | None = None
    mode: Mode | None = None
    on_conflict: OnConflict | None = None
    namespace: str | None = None
    header: str | None = None
    verify: Callable[[Any], None] | None = None
    credentials: Credentials | None = None
    # Per option, in the order of OPTIONS: its value above, checked and normalised (None: not
    # set), then its `_SOURCES`. Built once, as `resolve` runs on every guarded request.
    plan: tuple[tuple[Any, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        checked = check_options(**{name: getattr(self, name) for name in _SOURCES})
        plan = tuple((checked.get(name), *sources) for name, sources in _SOURCES.items())
        object.__setattr__(self, "plan", plan)


@dataclass(frozen=True)
class Resolved:
    """The options in force for one request, in the order of OPTIONS."""

    required: bool
    ttl: timedelta
    lease: timedelta  # Of a lease-mode claim; renewed while the view runs.
    mode: Mode
    on_conflict: OnConflict
    namespace: str
    header: str
    verify: Callable[[Any], None] | None
    credentials: Credentials | None  # None: as the view's kind decides (`http.credentials`).


def resolve(options: Options, view: Any) -> Resolved:
    """Each option from the first that sets it (not None): the decorator's argument, the view's
    ``get_idempotency_<name>()``, its ``idempotency_<name>`` attribute, the setting.

    `view` is the view instance, its class (from `IdempotencyMiddleware`), or None.
    """
    instance = view
    if isinstance(view, type):
        _refuse_hooks(view)
        instance = None
    values = []
    for value, hook, attribute, check, setting, default in options.plan:
        if value is None and view is not None:
            get = None if instance is None else getattr(instance, hook, None)
            if get is not None and (value := get()) is None:
                get = None  # The hook returned None: the attribute decides.
            if value is None:
                value = getattr(view, attribute, None)
            if value is not None:
                try:
                    value = check(value)
                except ImproperlyConfigured as exc:
                    source = f"{attribute} =" if get is None else f"{hook}() returned"
                    raise _refused(view, source, value, exc) from None
        if value is None:
            value = default if setting is None else getattr(conf, setting)
        values.append(value)
    return Resolved(*values)


def _refuse_hooks(view_class: type) -> None:
    """The middleware guards a class-based view before it creates the instance hooks need."""
    hooks = _hooks_of(view_class)
    if hooks:
        raise ImproperlyConfigured(
            f"{view_class.__qualname__}.{hooks[0]}() cannot be called: IdempotencyMiddleware "
            "guards a class-based view before the view exists. Decorate its handlers with "
            "@idempotent, or set the attribute instead."
        )


@functools.cache
def _hooks_of(view_class: type) -> tuple[str, ...]:
    """The hooks a view class defines, looked for once per class, not on every request."""
    return tuple(o.hook for o in OPTIONS if getattr(view_class, o.hook, None) is not None)


def _refused(view: Any, source: str, value: Any, why: Exception) -> ImproperlyConfigured:
    """A view's invalid value, named with where it came from: "View.idempotency_ttl = -1: ..."."""
    label = (view if isinstance(view, type) else type(view)).__qualname__
    return ImproperlyConfigured(f"{label}.{source} {value!r}: {why}")


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
    for option in OPTIONS:
        value = getattr(view, option.attribute, None)
        if value is None:
            continue
        try:
            option.check(value)
        except ImproperlyConfigured as exc:
            yield option.attribute, value, str(exc)
    try:
        is_exempt(view)
    except ImproperlyConfigured as exc:
        yield "idempotency_exempt", view.idempotency_exempt, str(exc)
