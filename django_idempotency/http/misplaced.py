"""`@idempotent` where it cannot guard (on a class, above `@api_view`): reported, never run."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest
from django.http.response import HttpResponseBase

from django_idempotency.http import problems

logger = logging.getLogger("django_idempotency")

# Set on what the decorator returns; the system check (E024) finds it on the routed views.
MARK = "idempotency_misplaced"


@dataclass(frozen=True)
class Misplaced:
    """Where `@idempotent` was put, why it cannot guard there, and where it goes instead."""

    place: str  # What it decorates, as the user wrote it.
    why: str
    hint: str

    def message(self, route: str | None = None) -> str:
        routed = "" if route is None else f" (routed at {route!r})"
        return f"@idempotent was applied to {self.place}{routed}: {self.why}"


def misplaced(target: Any) -> Misplaced | None:
    """The misplacement recorded on a routed callback, or on the view class it was built from."""
    found = getattr(target, MARK, None)
    return found if isinstance(found, Misplaced) else None


def refusing_view(view: Callable[..., Any], mistake: Misplaced) -> Callable[..., Any]:
    """`view` answering every request 500 view-misconfigured, with an ERROR line saying the fix.

    Running it unguarded would look like working idempotency until the first retry ran twice; a
    project started without the system checks (a WSGI server, the test client) learns of the
    mistake at its first request instead. Keeps the view's attributes (DRF's `cls`, Django's
    `view_class`, `csrf_exempt`), so the URLconf and the checks see the view as written.
    """
    if iscoroutinefunction(view):

        async def refuse_async(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            return _refuse(mistake)

        refused: Callable[..., Any] = refuse_async
    else:

        def refuse(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            return _refuse(mistake)

        refused = refuse
    functools.update_wrapper(refused, view)
    setattr(refused, MARK, mistake)
    return refused


def refusing_class(view_class: type, mistake: Misplaced) -> type:
    """The class itself, whose `as_view()` (the router's, or the URLconf's) builds a refusing
    view: returning another object would hand the router a function where it needs a class."""
    setattr(view_class, MARK, mistake)
    as_view = getattr(view_class, "as_view", None)
    build = getattr(as_view, "__func__", None)  # as_view is a classmethod on Django's and DRF's.
    if build is None:
        return view_class

    def refusing_as_view(cls: type, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        return refusing_view(build(cls, *args, **kwargs), mistake)

    refusing: classmethod[Any, ..., Any] = classmethod(functools.wraps(build)(refusing_as_view))
    view_class.as_view = refusing  # type: ignore[attr-defined]
    return view_class


def _refuse(mistake: Misplaced) -> HttpResponseBase:
    logger.error("Idempotent view misconfigured: %s %s", mistake.message(), mistake.hint)
    return problems.view_misconfigured()
