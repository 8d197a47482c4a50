"""OpenTelemetry spans for guarded requests, functions and tasks, with their outcome.

Installed by the app's `ready()` when opentelemetry-api is importable; see docs/tracing.md.
"""

from __future__ import annotations

from django_idempotency.contrib import missing

try:
    from django_idempotency.contrib.opentelemetry.spans import OUTCOME, install
except ModuleNotFoundError as exc:
    raise missing(exc, "otel") from exc

__all__ = ["OUTCOME", "install"]
