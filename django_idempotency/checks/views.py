"""`check_views`: routed view classes whose idempotency would fail silently or on first use."""

from __future__ import annotations

import difflib
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from django.core import checks
from django.core.checks import CheckMessage, Error
from django.urls import URLResolver, get_resolver

from django_idempotency.checks.ids import (
    INVALID_VIEW_ATTRIBUTE,
    MISPLACED_DECORATOR,
    MISSPELT_VIEW_ATTRIBUTE,
    MIXIN_AFTER_API_VIEW,
)
from django_idempotency.checks.reading import unknown_methods
from django_idempotency.checks.stores import _atomic_on_lease_only_store, _lease_only_store
from django_idempotency.contrib.rest_framework.mixins import IdempotencyMixin
from django_idempotency.http.misplaced import MARK, misplaced
from django_idempotency.http.options import attribute_errors
from django_idempotency.options import OPTION, OPTIONS

if TYPE_CHECKING:
    from django.apps import AppConfig


def check_views(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Routed view classes whose idempotency would fail silently, or on their first request."""
    messages: list[CheckMessage] = list(_misplaced_decorators())
    messages.extend(_atomic_views_on_lease_only_store())
    for route, view_class in _routed_view_classes():
        label = f"{view_class.__module__}.{view_class.__qualname__}"
        if _mixin_shadowed(view_class):
            bases = ", ".join(
                base.__name__ for base in view_class.__bases__ if base is not IdempotencyMixin
            )
            messages.append(
                Error(
                    f"{label} (routed at {route!r}) lists IdempotencyMixin after DRF's APIView"
                    " in its MRO: APIView's methods run instead of the mixin's, so no request"
                    " to it is guarded.",
                    hint=f"Put the mixin first: class {view_class.__name__}(IdempotencyMixin,"
                    f" {bases}).",
                    id=MIXIN_AFTER_API_VIEW,
                )
            )
        messages.extend(
            Error(
                f"{label}.{attribute} = {value!r} (routed at {route!r}): {why}",
                hint="Give it a value the matching option of @idempotent accepts (see"
                " docs/drf.md), or remove it to use the IDEMPOTENCY_* setting.",
                id=INVALID_VIEW_ATTRIBUTE,
            )
            for attribute, value, why in attribute_errors(view_class)
        )
        methods = getattr(view_class, "idempotent_methods", None)
        if methods is not None:
            messages.extend(unknown_methods(f"{label}.idempotent_methods", methods))
        messages.extend(_misspelt_attributes(label, route, view_class))
    return messages


# Every idempotency name a view class may define: the options' attributes and hooks, the mixin's
# methods, and the exemption.
_VIEW_NAMES = frozenset(
    {
        *(option.attribute for option in OPTIONS),
        *(option.hook for option in OPTIONS),
        "idempotent_methods",
        "get_idempotent_methods",
        "idempotency_exempt",
        "idempotency_options",  # Set by @idempotent on what it decorates.
        MARK,  # Set by @idempotent on a class it cannot guard (E024 reports it).
    }
)
_PREFIXES = ("idempotency_", "idempotent_", "get_idempotency_", "get_idempotent_")


def _misspelt_attributes(label: str, route: str, view_class: type) -> Iterator[CheckMessage]:
    """A name with this app's prefix that it does not read: a typo, silently ignored."""
    for name in sorted(dir(view_class)):
        if name.startswith(_PREFIXES) and name not in _VIEW_NAMES:
            [closest] = difflib.get_close_matches(name, _VIEW_NAMES, n=1, cutoff=0)
            yield checks.Warning(
                f"{label}.{name} (routed at {route!r}) is not an idempotency attribute; did you"
                f" mean {closest}?",
                hint=f"Rename it to {closest} if that is what you meant: as written it is"
                " ignored. An attribute of your own can stay; add this id to"
                " SILENCED_SYSTEM_CHECKS.",
                id=MISSPELT_VIEW_ATTRIBUTE,
            )


def _misplaced_decorators() -> Iterator[CheckMessage]:
    """Routed views `@idempotent` was misplaced on, which answer every request 500. Read from
    the URLconf this check imports (in the run that imports it first, too): the decorator does
    not raise as it is imported, where Django would print a traceback above the message."""
    seen: set[int] = set()
    for route, callback in _routed_views():
        mistake = misplaced(callback)
        if mistake is not None and id(mistake) not in seen:  # A viewset has several routes.
            seen.add(id(mistake))
            yield Error(mistake.message(route), hint=mistake.hint, id=MISPLACED_DECORATOR)


def _routed_view_classes() -> Iterator[tuple[str, type]]:
    """Each view class the URLconf routes to (DRF's `cls`, Django's `view_class`), once."""
    try:
        patterns = get_resolver().url_patterns
    except Exception:  # Django's own URL checks report a URLconf that does not load.
        return
    seen: set[type] = set()
    for route, callback in _routes(patterns, ""):
        view_class = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
        if isinstance(view_class, type) and view_class not in seen:
            seen.add(view_class)
            yield route, view_class


def _routed_views() -> list[tuple[str, Any]]:
    """Every route of the URLconf with its view; none when the URLconf does not load (Django's
    own URL checks report that)."""
    try:
        return list(_routes(get_resolver().url_patterns, ""))
    except Exception:
        return []


def _routes(patterns: Iterable[Any], prefix: str) -> Iterator[tuple[str, Any]]:
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            try:
                yield from _routes(pattern.url_patterns, route)
            except Exception:  # An include that fails to load: Django reports it.
                continue
        else:
            yield route, pattern.callback


def _mixin_shadowed(view_class: type) -> bool:
    # DRF is never imported here: a routed DRF view has imported it already.
    api_view = getattr(sys.modules.get("rest_framework.views"), "APIView", None)
    mro = view_class.__mro__
    return (
        api_view in mro
        and IdempotencyMixin in mro
        and mro.index(IdempotencyMixin) > mro.index(api_view)
    )


def _atomic_views_on_lease_only_store() -> Iterator[CheckMessage]:
    """Routed views whose attribute or @idempotent(mode=...) asks for atomic mode."""
    store = _lease_only_store()
    if store is None:
        return
    seen: set[int] = set()
    for route, callback in _routed_views():
        view_class = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
        holders = [callback] if view_class is None else [view_class, *vars(view_class).values()]
        for holder in holders:
            options = getattr(holder, "idempotency_options", None)
            mode = getattr(options, "mode", None) or getattr(holder, OPTION["mode"].attribute, None)
            if mode == "atomic" and id(holder) not in seen:
                seen.add(id(holder))
                name = getattr(holder, "__qualname__", repr(holder))
                label = f"{getattr(holder, '__module__', '')}.{name} (routed at {route!r})"
                yield _atomic_on_lease_only_store(label, store)
