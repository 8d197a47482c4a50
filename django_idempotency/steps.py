"""Steps of an operation: named parts of the work whose outbound calls share a derived key."""

from __future__ import annotations

from contextvars import ContextVar

# The name of the step the running code is in, if any (innermost operation only).
_current_step: ContextVar[str | None] = ContextVar("django_idempotency_step", default=None)


def current_step_name() -> str | None:
    """The name of the step running now, or None outside a step."""
    return _current_step.get()
