"""One span per guarded request, function call or task, built from the outcome signals."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, Span, SpanKind

from django_idempotency import signals
from django_idempotency.conf import conf
from django_idempotency.core.keys import key_hash

TRACER = "django_idempotency"
UID_PREFIX = "django_idempotency.contrib.opentelemetry."

# The span's attributes.
OUTCOME = "idempotency.outcome"
NAMESPACE = "idempotency.namespace"
KEY_HASH = "idempotency.key_hash"  # As in the logs: the key itself may carry client data.
OPERATION = "idempotency.operation"  # "request", or "call" for a function or a task.
CHECK_DURATION = "idempotency.check_duration"  # Seconds the store took to decide.

# Each signal that ends a span, and the outcome the span then reports. `claimed` opens the span
# of the caller that runs the work; `completed` ("fresh": the work ran and its result is stored)
# or `released` (nothing kept, the key given back) ends it. The others decide at once.
ENDING = {
    "replayed": "replay",
    "conflict": "conflict",
    "mismatch": "mismatch",
    "completed": "fresh",
    "released": "released",
}

# The spans of the keys claimed and not yet completed or released, by (namespace, owner, key):
# a claim belongs to one caller at a time, whichever thread (or, for async views, whichever
# turn of Django's shared sync thread) sends its signals.
_open: dict[tuple[str, str, str], Span] = {}
_lock = threading.Lock()


def _tracing() -> bool:
    """IDEMPOTENCY_TRACING is on and a tracer provider records spans: with the API alone (no
    SDK configured yet, or the no-op provider) a span would be built and dropped on every event,
    so none is built. A provider set later is seen at the next event."""
    return conf.TRACING and not isinstance(
        trace.get_tracer_provider(), (ProxyTracerProvider, NoOpTracerProvider)
    )


def install() -> None:
    """Connect the spans to the outcome signals; running it again changes nothing (dispatch_uid).

    Every receiver checks IDEMPOTENCY_TRACING on each event, so `override_settings` applies.
    Spans go to the tracer provider the project configures with the OpenTelemetry SDK; without
    one, OpenTelemetry's API records nothing.
    """
    signals.claimed.connect(open_span, weak=False, dispatch_uid=f"{UID_PREFIX}claimed")
    for name, outcome in ENDING.items():
        signals.BY_OUTCOME[name].connect(
            _ending_receiver(outcome), weak=False, dispatch_uid=f"{UID_PREFIX}{name}"
        )


def open_span(
    sender: Any,
    *,
    request: Any,
    namespace: str,
    owner: str,
    key: str,
    duration: float | None = None,
    **kwargs: Any,
) -> None:
    if not _tracing():
        return
    span = _start(request, namespace, key, duration)
    with _lock:
        # A claim taken over from a caller whose lease ran out: that caller's completion will
        # not be stored (nor announced), so its span ends here.
        previous = _open.pop((namespace, owner, key), None)
        _open[(namespace, owner, key)] = span
    if previous is not None:
        previous.set_attribute(OUTCOME, "taken-over")
        previous.end()


def _ending_receiver(outcome: str) -> Callable[..., None]:
    def receive(
        sender: Any,
        *,
        request: Any,
        namespace: str,
        owner: str,
        key: str,
        duration: float | None = None,
        **kwargs: Any,
    ) -> None:
        if not _tracing():
            return
        if outcome in ("fresh", "released"):
            with _lock:
                span = _open.pop((namespace, owner, key), None)
            if span is None:
                return  # Its claim was announced while tracing was off.
        else:
            # Decided at once, whoever holds the key (another caller may, with its span open).
            span = _start(request, namespace, key, duration)
        span.set_attribute(OUTCOME, outcome)
        span.end()

    return receive


def _start(request: Any, namespace: str, key: str, duration: float | None) -> Span:
    """A span from when the store was asked (`duration` ago) to now, as a child of the current
    span (the request's, where the project traces its requests)."""
    now = time.time_ns()
    start = now - int((duration or 0.0) * 1e9)
    attributes: dict[str, Any] = {
        NAMESPACE: namespace,
        KEY_HASH: key_hash(key),
        OPERATION: "call" if request is None else "request",
    }
    if duration is not None:
        attributes[CHECK_DURATION] = duration
    if request is not None:
        attributes["http.request.method"] = request.method or ""
    return trace.get_tracer(TRACER).start_span(
        f"idempotency {namespace}", kind=SpanKind.INTERNAL, start_time=start, attributes=attributes
    )
