"""OpenTelemetry: one span per guarded request, function call and task, with its outcome."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client, override_settings
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_idempotency import idempotent_function, signals
from django_idempotency.attempts import Attempt
from django_idempotency.core.outcomes import Scope
from django_idempotency.exceptions import KeyInProgress, KeyMismatch
from tests import tasks
from tests.stores import hold
from tests.utils import ViewKind, post

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("store")]

_exporter = InMemorySpanExporter()


@pytest.fixture(autouse=True)
def exported() -> Iterator[InMemorySpanExporter]:
    """The SDK's in-memory exporter behind the process's tracer provider, emptied per test."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        trace.set_tracer_provider(provider)
    _exporter.clear()
    yield _exporter
    _exporter.clear()


def outcomes(exporter: InMemorySpanExporter) -> list[tuple[str, Any, Any]]:
    return [
        (
            span.name,
            span.attributes["idempotency.outcome"],
            span.attributes["idempotency.operation"],
        )
        for span in ours(exporter)
    ]


def ours(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith("idempotency ")]


def test_each_guarded_request_is_one_span_with_its_outcome(
    client: Client, exported: InMemorySpanExporter
) -> None:
    url = ViewKind.FUNCTION.url
    post(client, url, {"amount": 10})  # Runs: fresh.
    post(client, url, {"amount": 10})  # Replayed.
    post(client, url, {"amount": 99})  # The same key, another body: mismatch.
    post(client, url, {"amount": 10}, key="key-2", outcome="invalid")  # 400: released.
    hold(Scope("default", "", "key-3"), url, {"amount": 10})
    post(client, url, {"amount": 10}, key="key-3")  # Another caller holds it: conflict.
    client.get(url)  # Not guarded: no span.

    assert outcomes(exported) == [
        ("idempotency default", "fresh", "request"),
        ("idempotency default", "replay", "request"),
        ("idempotency default", "mismatch", "request"),
        ("idempotency default", "released", "request"),
        ("idempotency default", "conflict", "request"),
    ]
    fresh = ours(exported)[0]
    assert fresh.attributes["http.request.method"] == "POST"
    assert fresh.attributes["idempotency.namespace"] == "default"
    assert fresh.attributes["idempotency.check_duration"] >= 0
    # The key may carry client data: the span has its hash, as the logs do.
    assert "key-1" not in str(dict(fresh.attributes))
    assert len(fresh.attributes["idempotency.key_hash"]) == 16
    assert fresh.end_time >= fresh.start_time


@idempotent_function(key="reference", namespace="traced")
def traced_charge(reference: str, amount: int) -> int:
    return amount


def test_each_function_call_is_one_span_with_its_outcome(exported: InMemorySpanExporter) -> None:
    traced_charge("r1", 1)
    traced_charge("r1", 1)
    with pytest.raises(KeyMismatch):
        traced_charge("r1", 2)

    assert outcomes(exported) == [
        ("idempotency traced", "fresh", "call"),
        ("idempotency traced", "replay", "call"),
        ("idempotency traced", "mismatch", "call"),
    ]


def test_a_function_call_refused_while_another_runs_is_a_conflict_span(
    exported: InMemorySpanExporter,
) -> None:
    @idempotent_function(key="reference", namespace="reentrant", payload="reference")
    def reentrant(reference: str, again: bool) -> str:
        if again:
            with pytest.raises(KeyInProgress):
                reentrant(reference, False)
        return "done"

    reentrant("r2", True)

    assert [outcome for _, outcome, _ in outcomes(exported)] == ["conflict", "fresh"]


def test_a_task_run_is_one_span_with_its_outcome(exported: InMemorySpanExporter) -> None:
    tasks.refund.apply(args=("traced-refund", 5))
    tasks.refund.apply(args=("traced-refund", 5))

    assert outcomes(exported) == [
        ("idempotency refund-tasks", "fresh", "call"),
        ("idempotency refund-tasks", "replay", "call"),
    ]


def test_the_span_is_a_child_of_the_span_current_when_the_key_is_checked(
    client: Client, exported: InMemorySpanExporter
) -> None:
    with trace.get_tracer("tests").start_as_current_span("POST /function/charges/") as parent:
        post(client, ViewKind.FUNCTION.url, {"amount": 10})

    [span] = ours(exported)
    assert span.parent is not None
    assert span.parent.span_id == parent.get_span_context().span_id
    assert span.context.trace_id == parent.get_span_context().trace_id


@override_settings(IDEMPOTENCY_TRACING=False)
def test_tracing_off_makes_no_span(client: Client, exported: InMemorySpanExporter) -> None:
    post(client, ViewKind.FUNCTION.url, {"amount": 10})
    traced_charge("r3", 1)

    assert ours(exported) == []


def test_a_claim_announced_while_tracing_was_off_ends_no_span(
    client: Client, exported: InMemorySpanExporter
) -> None:
    @idempotent_function(key="reference", namespace="switched")
    def switched(reference: str) -> str:
        from django.conf import settings

        settings.IDEMPOTENCY_TRACING = True  # Switched on while the work runs.
        return reference

    with override_settings(IDEMPOTENCY_TRACING=False):
        switched("r4")

    assert ours(exported) == []


def test_a_claim_taken_over_ends_the_span_of_the_caller_whose_lease_ran_out(
    exported: InMemorySpanExporter,
) -> None:
    # What the store announces when a second caller takes over a stale lease: a second claim of
    # one key, whose first holder will never announce its completion (it is not stored).
    scope = {"namespace": "leased", "owner": "", "key": "k"}
    signals.claimed.send(sender=Attempt, request=None, duration=0.001, **scope)
    signals.claimed.send(sender=Attempt, request=None, duration=0.001, **scope)
    signals.completed.send(sender=Attempt, request=None, duration=None, **scope)

    assert [outcome for _, outcome, _ in outcomes(exported)] == ["taken-over", "fresh"]
