"""The outbound client's retry policy, through each driver, against a real loopback server."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

import pytest

from tests.downstream import Downstream, reset_downstream
from tests.outbound_clients import CALLERS, Caller, Clock, refused_port

pytestmark = [pytest.mark.urls("tests.downstream"), pytest.mark.django_db(transaction=True)]

KEY = "order-1-charge"
MakeCaller = Callable[..., Caller]


@pytest.fixture
def downstream() -> Iterator[Downstream]:
    yield from reset_downstream()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=list(CALLERS))
def caller(request: pytest.FixtureRequest, clock: Clock) -> MakeCaller:
    """A driver (httpx, async httpx, requests) with the clock's policy and these options."""

    def make(**policy: Any) -> Caller:
        return CALLERS[request.param](clock.policy(**policy))

    return make


@pytest.fixture
def url(live_server: Any) -> Callable[[str], str]:
    return lambda path: f"{live_server.url}{path}"


def test_503_twice_then_201_sends_the_same_key_three_times_with_growing_delays(
    downstream: Downstream, caller: MakeCaller, clock: Clock, url: Callable[[str], str]
) -> None:
    path = downstream.script("flaky", 503, 503)

    answer = caller(base_delay=0.5, max_delay=8).send("POST", url(path), key=KEY)

    assert answer.status == 201
    assert downstream.keys("flaky") == [KEY, KEY, KEY]
    # Full jitter: each delay drawn from [0, min(cap, base * 2**n)]; here the top was drawn.
    assert clock.ranges == [(0.0, 0.5), (0.0, 1.0)]
    assert clock.slept == [0.5, 1.0]


def test_backoff_stays_within_its_bounds_and_its_cap(
    downstream: Downstream, clock: Clock, url: Callable[[str], str]
) -> None:
    path = downstream.script("flaky", *[503] * 7)
    drawn = random.Random(2026)
    policy = clock.policy(max_attempts=8, base_delay=1, max_delay=4, random=drawn.uniform)

    for kind in CALLERS.values():
        downstream.script("flaky", *[503] * 7)
        clock.slept.clear()
        assert kind(policy).send("POST", url(path), key=KEY).status == 201

        bounds = [min(4, 1 * 2**n) for n in range(7)]
        assert len(clock.slept) == 7
        assert all(0 <= slept <= bound for slept, bound in zip(clock.slept, bounds, strict=True))
        assert max(clock.slept[3:]) > 2  # The cap is reached, not a lower bound kept.


def test_retry_after_in_seconds_is_waited_as_given(
    downstream: Downstream, caller: MakeCaller, clock: Clock, url: Callable[[str], str]
) -> None:
    path = downstream.script("busy", (429, {"Retry-After": "2"}))

    answer = caller().send("POST", url(path), key=KEY)

    assert answer.status == 201
    assert clock.slept == [2.0]
    assert clock.ranges == [(0.0, 0.5)]  # The backoff drawn, then replaced by Retry-After.
    assert downstream.keys("busy") == [KEY, KEY]


def test_retry_after_as_an_http_date_is_waited_until_then(
    downstream: Downstream, caller: MakeCaller, clock: Clock, url: Callable[[str], str]
) -> None:
    now = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)
    later = format_datetime(now.replace(second=3), usegmt=True)
    path = downstream.script("busy", (503, {"Retry-After": later}))

    answer = caller(now=now.timestamp).send("POST", url(path), key=KEY)

    assert answer.status == 201
    assert clock.slept == [3.0]


def test_a_retry_after_over_the_cap_stops_and_returns_the_answer(
    downstream: Downstream, caller: MakeCaller, clock: Clock, url: Callable[[str], str]
) -> None:
    path = downstream.script("busy", (429, {"Retry-After": "120"}))

    answer = caller(retry_after_cap=20).send("POST", url(path), key=KEY)

    assert answer.status == 429
    assert answer.headers["Retry-After"] == "120"
    assert clock.slept == []
    assert len(downstream.seen["busy"]) == 1


def test_an_unsafe_request_without_a_key_is_sent_once_and_warned_about_once(
    downstream: Downstream,
    caller: MakeCaller,
    clock: Clock,
    url: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django_idempotency.outbound import calls

    monkeypatch.setattr(calls, "_warned_keyless", set())
    path = downstream.script("keyless", 503, 503)

    with caplog.at_level(logging.WARNING, logger="django_idempotency"):
        first = caller().send("POST", url(path))
        second = caller().send("POST", url(path))

    assert (first.status, second.status) == (503, 503)
    assert downstream.keys("keyless") == [None, None]  # Once each: never retried.
    assert clock.slept == []
    warnings = [r.getMessage() for r in caplog.records if "without an Idempotency-Key" in r.message]
    assert len(warnings) == 1
    assert f"POST {url(path)} is sent without" in warnings[0]


def test_a_safe_request_is_retried_without_a_key(
    downstream: Downstream, caller: MakeCaller, clock: Clock, url: Callable[[str], str]
) -> None:
    path = downstream.script("listing", 503)

    assert caller().send("GET", url(path)).status == 201

    assert downstream.keys("listing") == [None, None]
    assert clock.slept == [0.5]


@pytest.mark.parametrize("status", [400, 422])
def test_a_wrong_request_is_not_retried(
    downstream: Downstream,
    caller: MakeCaller,
    clock: Clock,
    url: Callable[[str], str],
    status: int,
) -> None:
    # Not even when the downstream says it may be: the same request gets the same answer.
    path = downstream.script("wrong", (status, {"Stripe-Should-Retry": "true"}))

    assert caller().send("POST", url(path), key=KEY).status == status

    assert len(downstream.seen["wrong"]) == 1
    assert clock.slept == []


def test_stripe_should_retry_false_stops_a_retryable_answer(
    downstream: Downstream, caller: MakeCaller, clock: Clock, url: Callable[[str], str]
) -> None:
    path = downstream.script("stripe", (503, {"Stripe-Should-Retry": "false"}))

    assert caller().send("POST", url(path), key=KEY).status == 503

    assert len(downstream.seen["stripe"]) == 1


def test_stripe_should_retry_true_retries_an_answer_otherwise_final(
    downstream: Downstream, caller: MakeCaller, clock: Clock, url: Callable[[str], str]
) -> None:
    path = downstream.script("stripe", (500, {"Stripe-Should-Retry": "true"}), 500)

    assert caller().send("POST", url(path), key=KEY).status == 500  # The plain 500 is final.

    assert downstream.keys("stripe") == [KEY, KEY]


def test_the_deadline_stops_retries_before_a_delay_would_pass_it(
    downstream: Downstream, caller: MakeCaller, clock: Clock, url: Callable[[str], str]
) -> None:
    path = downstream.script("down", *[503] * 9)

    # Delays 2, then 4: the second would end 6 s after the first attempt, past 5 s.
    answer = caller(base_delay=2, max_delay=8, deadline=5, max_attempts=10).send(
        "POST", url(path), key=KEY
    )

    assert answer.status == 503
    assert clock.slept == [2.0]
    assert len(downstream.seen["down"]) == 2


def test_max_attempts_stops_retries(
    downstream: Downstream, caller: MakeCaller, clock: Clock, url: Callable[[str], str]
) -> None:
    path = downstream.script("down", *[502] * 9)

    assert caller(max_attempts=3).send("POST", url(path), key=KEY).status == 502

    assert downstream.keys("down") == [KEY] * 3
    assert len(clock.slept) == 2


@pytest.mark.parametrize("status", [409, 504])
def test_a_downstream_still_running_the_key_or_a_gateway_timeout_is_retried(
    downstream: Downstream,
    caller: MakeCaller,
    clock: Clock,
    url: Callable[[str], str],
    status: int,
) -> None:
    path = downstream.script("running", status)

    assert caller().send("POST", url(path), key=KEY).status == 201

    assert downstream.keys("running") == [KEY, KEY]


def test_a_refused_connection_is_retried_then_raised(caller: MakeCaller, clock: Clock) -> None:
    driver = caller(max_attempts=3)

    with refused_port() as port, pytest.raises(driver.connect_error):
        driver.send("POST", f"http://127.0.0.1:{port}/charges/", key=KEY)

    assert clock.slept == [0.5, 1.0]


def test_a_timeout_is_retried_with_the_same_key_then_raised(
    downstream: Downstream, caller: MakeCaller, clock: Clock, url: Callable[[str], str]
) -> None:
    driver = caller(max_attempts=2)

    with pytest.raises(driver.timeout_error):
        driver.send("POST", url("/downstream/slow/"), key=KEY, timeout=0.3)

    assert downstream.arrived("slow", 2) == [KEY, KEY]
    assert clock.slept == [0.5]
