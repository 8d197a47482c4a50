"""Document idempotent DRF operations in drf-spectacular schemas: key header, problems, replays."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, cast

from drf_spectacular.extensions import OpenApiViewExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ComponentRegistry, ResolvedComponent
from drf_spectacular.utils import OpenApiParameter
from rest_framework.views import APIView

from django_idempotency.conf import conf
from django_idempotency.contrib.rest_framework import IdempotencyMixin
from django_idempotency.contrib.rest_framework.project import guarding_all_views, with_mixin
from django_idempotency.http import openapi, problems
from django_idempotency.http.options import Options, Resolved, is_exempt, resolve
from django_idempotency.http.requests import SAFE_METHODS

# The replacement class of each idempotent view (see `IdempotentViewExtension`), one per view
# class of the URLconf, kept for the life of the process.
_replacements: dict[type[APIView], tuple[list[Any], type[APIView]]] = {}


class IdempotentAutoSchema(AutoSchema):
    """Adds the key header, the problem responses and the replay header to idempotent operations.

    Placed in front of the schema class an operation would otherwise use, so ``@extend_schema``
    and custom schema classes keep working; operations the guard does not touch are unchanged.
    """

    # The handler's own @idempotent options; None: guarded only if the mixin guards its method.
    idempotency_options: Options | None = None

    def get_override_parameters(self) -> list[Any]:
        parameters = super().get_override_parameters()
        resolved = self._idempotency()
        if resolved is None:
            return parameters
        # First, so that a parameter of the same name given to @extend_schema replaces it.
        return [_key_parameter(resolved), *parameters]

    def get_operation(
        self,
        path: str,
        path_regex: str,
        path_prefix: str,
        method: str,
        registry: ComponentRegistry,
    ) -> dict[str, Any] | None:
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        resolved = self._idempotency()
        if operation is not None and resolved is not None:
            openapi.document_responses(operation["responses"], resolved, _problem_schema(registry))
            operation[openapi.EXTENSION] = openapi.extension(resolved)
        return operation

    def _idempotency(self) -> Resolved | None:
        """The options the guard would apply to this operation; None if it is not guarded."""
        method = self.method
        if method in SAFE_METHODS:
            return None
        if self.idempotency_options is not None:
            return resolve(self.idempotency_options, self.view)
        view = self.view
        if isinstance(view, IdempotencyMixin) and method in view.get_idempotent_methods():
            return resolve(Options(), view)
        return None


def _guarded_by_the_project(view: type[APIView], route: Any) -> bool:
    """IDEMPOTENCY_GUARD_ALL_VIEWS guards this view on this route, as its requests are."""
    return guarding_all_views() and not is_exempt(view, route)


class IdempotentViewExtension(OpenApiViewExtension):  # type: ignore[no-untyped-call]
    """Gives the handlers of idempotent views an `IdempotentAutoSchema`; other views stay as is.

    drf-spectacular calls it for every DRF view while it builds a schema, and uses the class it
    returns instead of the view's for that run only.
    """

    target_class = APIView
    match_subclasses = True
    # drf-spectacular applies one view extension per view: any other one matching takes it.
    priority = -1

    def view_replacement(self) -> type[APIView]:
        view: type[APIView] = self.target
        actions = getattr(self.target_callback, "actions", None) or {}
        names = _handler_names(view) | {
            name for method, name in actions.items() if method.upper() not in SAFE_METHODS
        }
        original = view
        if not issubclass(view, IdempotencyMixin) and _guarded_by_the_project(
            view, self.target_callback
        ):
            view = with_mixin(cast(Any, view))  # Documented as it runs: mixin in front.
        mixin = issubclass(view, IdempotencyMixin)
        handlers: list[tuple[str, Callable[..., Any], type[AutoSchema], Options | None]] = []
        for name in sorted(names):
            handler = getattr(view, name, None)
            options = declared_options(handler)
            if handler is None or (options is None and not mixin) or is_exempt(handler):
                continue
            base = getattr(handler, "kwargs", {}).get("schema") or view.schema
            base_class = base if isinstance(base, type) else type(base)
            if issubclass(base_class, AutoSchema):
                handlers.append((name, handler, base_class, options))
        if not handlers:
            return view
        # The same class for every route of the view: with a single view class in the schema,
        # drf-spectacular guesses no path prefix, and a class per route would change its guess.
        cached = _replacements.get(view)
        if cached is not None and cached[0] == handlers:
            return cached[1]
        documented = {
            name: _with_schema(
                handler,
                type(
                    f"Idempotent{base_class.__name__}",
                    (IdempotentAutoSchema, base_class),
                    {"idempotency_options": options},
                ),
            )
            for name, handler, base_class, options in handlers
        }
        # Named and documented as the view, which drf-spectacular reads for descriptions.
        names_of_view = {n: getattr(original, n) for n in ("__doc__", "__module__", "__qualname__")}
        replacement = type(view.__name__, (view,), {**names_of_view, **documented})
        _replacements[view] = (handlers, replacement)
        return replacement


def _handler_names(view: type[APIView]) -> set[str]:
    """What any route of the view may dispatch an unsafe method to."""
    # Handlers named by their method, a router's viewset actions, and extra actions (@action).
    names = {name for name in view.http_method_names if name.upper() not in SAFE_METHODS}
    names.update(("create", "update", "partial_update", "destroy"))
    for extra in getattr(view, "get_extra_actions", list)():
        names.update((extra.__name__, *extra.mapping.values()))
    return names


def declared_options(handler: Any) -> Options | None:
    """The options ``@idempotent`` put on a handler, or on the function under ``@api_view``."""
    options = getattr(handler, "idempotency_options", None)
    if options is None and getattr(handler, "__module__", None) == "rest_framework.decorators":
        # @api_view puts on its class a closure that calls the decorated function.
        func = inspect.getclosurevars(handler).nonlocals.get("func")
        options = getattr(func, "idempotency_options", None)
    return options if isinstance(options, Options) else None


def _with_schema(handler: Callable[..., Any], schema: type[AutoSchema]) -> Callable[..., Any]:
    """The handler, carrying ``schema`` where drf-spectacular looks for an action's schema."""

    @functools.wraps(handler)
    def documented(*args: Any, **kwargs: Any) -> Any:
        return handler(*args, **kwargs)

    # A new dict: wraps() shares the original's, and the original belongs to the user's view.
    documented.kwargs = {**getattr(handler, "kwargs", {}), "schema": schema}  # type: ignore[attr-defined]
    return documented


def _key_parameter(resolved: Resolved) -> OpenApiParameter:
    return OpenApiParameter(
        name=resolved.header,
        type=openapi.key_schema(),
        location=OpenApiParameter.HEADER,
        required=resolved.required,
        description=openapi.key_description(resolved),
    )


def _problem_schema(registry: ComponentRegistry) -> dict[str, str]:
    component = ResolvedComponent(  # type: ignore[no-untyped-call]
        name=openapi.PROBLEM_COMPONENT,
        type=ResolvedComponent.SCHEMA,
        object=openapi.PROBLEM_COMPONENT,
        schema=openapi.PROBLEM_SCHEMA,
    )
    registry.register_on_missing(component)
    return component.ref


class KeyStatusViewExtension(OpenApiViewExtension):  # type: ignore[no-untyped-call]
    """Documents the key-status view (`KeyStatusAPIView`): its key header and its answers."""

    target_class = "django_idempotency.contrib.rest_framework.views.KeyStatusAPIView"
    match_subclasses = True

    def view_replacement(self) -> type[APIView]:
        from drf_spectacular.utils import OpenApiResponse, extend_schema

        view: type[APIView] = self.target

        def problem(description: str) -> OpenApiResponse:
            return OpenApiResponse(response=openapi.PROBLEM_SCHEMA, description=description)

        documented = extend_schema(
            summary="What became of the caller's request with this key",
            parameters=[
                OpenApiParameter(
                    name=conf.HEADER,
                    type=openapi.key_schema(),
                    location=OpenApiParameter.HEADER,
                    required=True,
                    description="The key of the earlier request to look up.",
                )
            ],
            responses={
                (200, "*/*"): OpenApiResponse(
                    description="The stored response of the caller's completed request with"
                    " this key, its own status, headers and body, exactly as a retry gets it"
                    " (with Idempotent-Replayed: true)."
                ),
                (400, problems.PROBLEM_CONTENT_TYPE): problem("The key is missing or malformed."),
                (404, problems.PROBLEM_CONTENT_TYPE): problem(
                    "key-not-found: nothing is stored for this key and the caller (or its"
                    " request stopped before completing): send the request again, same key."
                ),
                (409, problems.PROBLEM_CONTENT_TYPE): problem(
                    "request-in-progress: the request is still running; ask again later."
                ),
                (410, problems.PROBLEM_CONTENT_TYPE): problem(
                    "The request completed, but its response was not kept whole."
                ),
                (503, problems.PROBLEM_CONTENT_TYPE): problem("The store cannot be reached."),
            },
        )(view.get)  # type: ignore[attr-defined]
        return cast(type[APIView], type(view.__name__, (view,), {"get": documented}))
