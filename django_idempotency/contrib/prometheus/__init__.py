"""Prometheus metrics for outcomes, check latency, the cache tier, purges and outbound calls.

Installed by the app's `ready()` when prometheus_client is importable; see docs/metrics.md.
"""

from __future__ import annotations

from django_idempotency.contrib import missing

try:
    from django_idempotency.contrib.prometheus.metrics import Metrics, get_metrics, install
except ModuleNotFoundError as exc:
    raise missing(exc, "prometheus") from exc

__all__ = ["Metrics", "get_metrics", "install"]
