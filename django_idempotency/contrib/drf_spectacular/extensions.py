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
from django_idempotency.core.keys import MAX_KEY_LENGTH
from django_idempotency.http import problems
from django_idempotency.http.options import Options, Resolved, is_exempt, resolve
from django_idempotency.http.owners import authenticated_user
from django_idempotency.http.requests import SAFE_METHODS
from django_idempotency.http.responses import REPLAYED_HEADER

PROBLEM_COMPONENT = "IdempotencyProblem"
# What the guard answers instead of running the view; its 413 and 503 are left out, as any
# endpoint can be sent too large a body or find its database down.
PROBLEM_STATUSES = (400, 409, 410, 422)


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
            _document_responses(operation["responses"], resolved, registry)
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
    if resolved.required:
        presence = "Required: a request without it is answered 400."
    else:
        presence = "Optional: a request without it runs unprotected."
    schema: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH}
    key_format = {"uuid": "uuid", "ulid": "ulid"}.get(conf.KEY_FORMAT or "")
    if key_format:
        schema["format"] = key_format
    return OpenApiParameter(
        name=resolved.header,
        type=schema,
        location=OpenApiParameter.HEADER,
        required=resolved.required,
        description=(
            "A unique value for this operation, such as a UUID or a ULID; send the same value "
            "when retrying it. The first request with a key runs; a retry with the same key and "
            f"the same request gets the stored response back, with `{REPLAYED_HEADER}: true`, "
            "and does not run again. The same key with a different request is answered 422; a "
            f"retry while the first request is still running, 409. {presence}"
        ),
    )


def _document_responses(
    responses: dict[str, Any], resolved: Resolved, registry: ComponentRegistry
) -> None:
    for code, response in responses.items():
        if code.startswith("2"):
            response.setdefault("headers", {}).setdefault(
                REPLAYED_HEADER,
                {
                    "description": (
                        "`true` when this is the stored response to an earlier request with "
                        "the same key, replayed without running the operation again."
                    ),
                    "schema": {"type": "string", "enum": ["true"]},
                },
            )
    problem = _problem_schema(registry)
    for status in PROBLEM_STATUSES:
        kinds = [kind for kind in problems.ALL_KINDS if kind.status == status]
        kinds = [kind for kind in kinds if _can_answer(kind, resolved)]
        if not kinds:
            continue
        # A status the operation documents already, e.g. a 400 for validation errors, gains
        # the problem document as a second content type.
        response = responses.setdefault(
            str(status), {"description": "; ".join(kind.title for kind in kinds) + "."}
        )
        response.setdefault("content", {}).setdefault(
            problems.PROBLEM_CONTENT_TYPE,
            {
                "schema": problem,
                "examples": {
                    kind.slug: {
                        "summary": kind.title,
                        "value": {
                            "type": problems.problem_type(kind),
                            "title": kind.title,
                            "status": kind.status,
                            "detail": "What went wrong with this request and what to do.",
                        },
                    }
                    for kind in kinds
                },
            },
        )
        if status == problems.IN_PROGRESS.status:
            response.setdefault("headers", {}).setdefault(
                "Retry-After",
                {
                    "description": "Seconds to wait before sending the request again, same key.",
                    "schema": {"type": "integer"},
                },
            )


def _can_answer(kind: problems.ProblemKind, resolved: Resolved) -> bool:
    if kind is problems.MISSING_KEY:
        return resolved.required
    if kind is problems.DELIVERY_REJECTED:
        return resolved.verify is not None
    if kind is problems.RESPONSE_NOT_STORED:
        return conf.MAX_STORED_BYTES is not None
    if kind is problems.RESPONSE_NOT_DECRYPTABLE:  # Once a key is retired too soon.
        return conf.ENCRYPTION_KEYS is not None
    if kind is problems.INVALID_OWNER:  # The default owner, a user's primary key, is always valid.
        return conf.OWNER_RESOLVER is not authenticated_user
    return True


def _problem_schema(registry: ComponentRegistry) -> dict[str, str]:
    component = ResolvedComponent(  # type: ignore[no-untyped-call]
        name=PROBLEM_COMPONENT,
        type=ResolvedComponent.SCHEMA,
        object=PROBLEM_COMPONENT,
        schema={
            "type": "object",
            "description": (
                "An RFC 9457 problem document: the idempotency guard answered the request "
                "itself, without running the operation."
            ),
            "properties": {
                "type": {
                    "type": "string",
                    "format": "uri",
                    "description": "Identifies the kind of error, stably: match on it.",
                },
                "title": {"type": "string", "description": "A short summary of the kind."},
                "status": {"type": "integer", "description": "The HTTP status code."},
                "detail": {
                    "type": "string",
                    "description": "What went wrong with this request and what to do.",
                },
            },
            "required": ["type", "title", "status", "detail"],
        },
    )
    registry.register_on_missing(component)
    return component.ref
