"""The seam to a framework whose views get a request of its own wrapping Django's (DRF's)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from django.http import HttpRequest
from django.http.response import HttpResponseBase

if TYPE_CHECKING:
    from django_idempotency.http.options import Options


class Framework(Protocol):
    """What `http/` and `@idempotent` ask of such a framework, knowing nothing else of it.

    Its integration plugs one in (`contrib.rest_framework`, which the app's ``ready()`` imports
    when DRF is installed); with none, every request is Django's own.
    """

    def http_request(self, request: Any) -> HttpRequest | None:
        """The HttpRequest that `request` wraps; None when it is not one of this framework's."""

    def parsed_body(self, request: Any, media_type: str) -> bytes:
        """A body whose stream the framework's parser consumed, in canonical form."""

    def run(
        self,
        call: Callable[[], HttpResponseBase],
        request: Any,
        options: Options,
        view: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> HttpResponseBase:
        """Guard a handler called with (`args`, `kwargs`), among them `request`; `view` is None
        for a function."""

    async def run_async(
        self,
        call: Callable[[], Awaitable[HttpResponseBase]],
        request: Any,
        options: Options,
        view: Any,
    ) -> HttpResponseBase:
        """Guard an async handler that received `request`; `view` is None for a function."""


# Read on every call, never copied: a framework plugged in after this module's users were
# imported is still the one they see.
current: Framework | None = None


def plug_in(framework: Framework) -> None:
    global current
    # Runs when a contrib package is imported, before mutation testing switches a mutant on:
    # a mutant here could never be seen (every DRF test depends on this line).
    current = framework  # pragma: no mutate


def framework() -> Framework:
    """The framework plugged in; asked only about a request it recognised, so there is one."""
    assert current is not None
    return current
