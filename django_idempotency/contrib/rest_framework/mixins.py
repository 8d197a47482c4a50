"""`IdempotencyMixin`: guard DRF handlers, after authentication, permissions and throttles."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from django_idempotency.conf import conf
from django_idempotency.decorators import guarded
from django_idempotency.http.guard import BODY_ERRORS, body_problem
from django_idempotency.http.options import Options, is_exempt
from django_idempotency.http.requests import keep_body_readable
from django_idempotency.options import Credentials, Mode, OnConflict
from django_idempotency.stores.connections import on_a_live_connection

# The mixin's handlers take every option from the view's attributes and the settings.
_INHERITED = Options()

# DRF's own handlers that do nothing but call another method of the view, by (module, name):
# CreateAPIView.post() calls create(), partial_update() calls update(), and so on.
_DELEGATES = {
    ("rest_framework.generics", "post"): "create",
    ("rest_framework.generics", "put"): "update",
    ("rest_framework.generics", "patch"): "partial_update",
    ("rest_framework.generics", "delete"): "destroy",
    ("rest_framework.mixins", "partial_update"): "update",
}


class IdempotencyMixin:
    """Put before the DRF base class: ``class PaymentViewSet(IdempotencyMixin, ModelViewSet)``.

    Each ``idempotency_*`` attribute left at None uses its ``IDEMPOTENCY_*`` setting (none for
    ``idempotency_verify`` and ``idempotency_credentials``); a ``get_idempotency_<name>()``
    method, if the view defines one, gives the value for each request instead. An action
    decorated with ``@idempotent(...)`` keeps its own options and is guarded whatever its method.
    """

    idempotent_methods: Sequence[str] | None = None
    # One per option of `django_idempotency.options.OPTIONS`, which a test holds them to.
    idempotency_required: bool | None = None
    idempotency_ttl: timedelta | float | None = None
    idempotency_lease: timedelta | float | None = None
    idempotency_mode: Mode | None = None
    idempotency_on_conflict: OnConflict | None = None
    idempotency_namespace: str | None = None
    idempotency_header: str | None = None
    idempotency_verify: Callable[[Any], None] | None = None
    idempotency_credentials: Credentials | None = None

    def get_idempotent_methods(self) -> frozenset[str]:
        methods = self.idempotent_methods
        if methods is None:
            return frozenset(conf.METHODS)
        return frozenset(m.upper() for m in ([methods] if isinstance(methods, str) else methods))

    def perform_authentication(self, request: Any) -> None:
        if request.method in self.get_idempotent_methods():
            keep_body_readable(request._request)
        # Loading the session and the user is most often a request's first query: a connection
        # a database restart left dead (CONN_MAX_AGE) is replaced here, not answered with a 500.
        on_a_live_connection(lambda: super(IdempotencyMixin, self).perform_authentication(request))  # type: ignore[misc]

    def handle_exception(self, exc: Exception) -> Any:
        # DRF's CSRF check reads a form before the guard does: a body too large or with too many
        # fields is still a problem+json answer on a guarded method, not Django's HTML 400.
        method = getattr(getattr(self, "request", None), "method", None)
        if isinstance(exc, BODY_ERRORS) and method in self.get_idempotent_methods():
            problem = body_problem(exc)
            if conf.ERROR_FORMAT != "drf":
                return problem
            from django_idempotency.contrib.rest_framework.errors import IdempotencyProblem

            exc = IdempotencyProblem(problem)
        return super().handle_exception(exc)  # type: ignore[misc]

    def initial(self, request: Any, *args: Any, **kwargs: Any) -> None:
        # Authentication, permissions and throttles run first: a replay never skips them.
        super().initial(request, *args, **kwargs)  # type: ignore[misc]
        name = request.method.lower()
        handler = getattr(self, name, None) if name in self.http_method_names else None  # type: ignore[attr-defined]
        if handler is None or declares_its_guard(self, handler):
            return  # Unmapped (DRF answers 405), or a decorator guards it: the more specific.
        route = getattr(request._request.resolver_match, "func", None)
        if is_exempt(self, handler, route):
            return
        if request.method in self.get_idempotent_methods():
            # Shadow the handler on this instance only; dispatch() looks it up right after.
            setattr(self, name, guarded(handler, _INHERITED))


def declares_its_guard(view: Any, handler: Any) -> bool:
    """Whether `handler`, or the action a DRF generic handler merely calls (``create()`` for
    ``post()``), is decorated with `@idempotent`: that decorator then guards the request with its
    own options, and a guard around it (the mixin, the project-wide guard) stays out of its way.
    """
    seen = 0
    while handler is not None and seen < len(_DELEGATES):
        if hasattr(handler, "idempotency_options"):
            return True
        function = getattr(handler, "__func__", handler)
        name = (getattr(function, "__module__", ""), getattr(function, "__name__", ""))
        action = _DELEGATES.get(name)
        handler = getattr(view, action, None) if action else None
        seen += 1
    return False
