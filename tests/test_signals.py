"""Signals: each carries the request (None outside HTTP); a failing receiver fails nothing."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.dispatch import Signal
from django.http import HttpRequest
from django.test import Client

from django_idempotency import idempotent_function, signals
from tests.models import Charge
from tests.utils import ViewKind, post


@pytest.fixture
def received() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """(outcome, keyword arguments) of every signal sent during the test."""
    seen: list[tuple[str, dict[str, Any]]] = []
    receivers = {}
    for outcome, signal in signals.BY_OUTCOME.items():

        def receiver(sender: Any, outcome: str = outcome, **kwargs: Any) -> None:
            seen.append((outcome, kwargs))

        receivers[outcome] = receiver
        signal.connect(receiver)
    yield seen
    for outcome, signal in signals.BY_OUTCOME.items():
        signal.disconnect(receivers[outcome])


@pytest.mark.django_db
@pytest.mark.parametrize(
    "view_kind",
    [ViewKind.FUNCTION, ViewKind.DRF_APIVIEW, ViewKind.VIEWSET_MIXIN],
    ids=lambda kind: kind.name.lower(),
)
def test_every_signal_of_a_request_carries_its_http_request(
    client: Client, received: list[tuple[str, dict[str, Any]]], view_kind: ViewKind
) -> None:
    post(client, view_kind.url)
    post(client, view_kind.url)
    post(client, view_kind.url, {"amount": 99})

    assert [outcome for outcome, _ in received] == ["claimed", "completed", "replayed", "mismatch"]
    for _, kwargs in received:
        request = kwargs["request"]
        assert isinstance(request, HttpRequest)
        assert (request.method, request.path) == ("POST", view_kind.url)
        assert request.headers["Idempotency-Key"] == kwargs["key"] == "key-1"


@pytest.mark.django_db
def test_a_released_key_signals_with_its_request(
    client: Client, received: list[tuple[str, dict[str, Any]]]
) -> None:
    post(client, "/function/charges/", outcome="invalid")

    assert [outcome for outcome, _ in received] == ["claimed", "released"]
    assert received[1][1]["request"].path == "/function/charges/"


@idempotent_function(key="invoice")
def send_invoice(invoice: str) -> str:
    return f"sent {invoice}"


@pytest.mark.django_db
def test_signals_outside_http_carry_no_request(
    received: list[tuple[str, dict[str, Any]]],
) -> None:
    send_invoice("inv-1")
    send_invoice("inv-1")

    assert [outcome for outcome, _ in received] == ["claimed", "completed", "replayed"]
    assert [kwargs["request"] for _, kwargs in received] == [None, None, None]


def broken_receiver(sender: Any, **kwargs: Any) -> None:
    raise RuntimeError("the statsd host is gone")


@pytest.fixture
def broken_receivers() -> Iterator[None]:
    connected: list[Signal] = list(signals.BY_OUTCOME.values())
    for signal in connected:
        signal.connect(broken_receiver)
    yield
    for signal in connected:
        signal.disconnect(broken_receiver)


@pytest.mark.django_db
@pytest.mark.usefixtures("broken_receivers")
def test_a_failing_receiver_never_fails_the_request_and_is_logged(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="django.dispatch"):
        first = post(client, "/viewset/charges/")
        retry = post(client, "/viewset/charges/")

    assert first.status_code == retry.status_code == 201
    assert retry["Idempotent-Replayed"] == "true"
    assert Charge.objects.count() == 1
    failures = [record for record in caplog.records if record.name == "django.dispatch"]
    assert len(failures) == 3  # claimed, completed, replayed
    assert all("broken_receiver" in record.getMessage() for record in failures)
    assert all(
        record.exc_info and str(record.exc_info[1]) == "the statsd host is gone"
        for record in failures
    )


@pytest.mark.django_db
@pytest.mark.usefixtures("broken_receivers")
def test_a_failing_receiver_never_fails_an_idempotent_function() -> None:
    assert send_invoice("inv-2") == send_invoice("inv-2") == "sent inv-2"
