"""The outbound client's decisions alone, without a server: retry or not, how long, what outcome."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_idempotency.outbound import RetryPolicy
from django_idempotency.outbound.outcomes import outcome_of
from django_idempotency.outbound.policy import Decision, Failure, Result, retry_after


def decide(result: Result, attempt: int = 1, elapsed: float = 0.0, **policy: Any) -> Decision:
    rules = RetryPolicy(random=lambda low, high: high, now=lambda: 0.0, **policy)
    return rules.decide(result, attempt=attempt, elapsed=elapsed, keyed=True)


@pytest.mark.parametrize(
    ("result", "retried"),
    [
        (Result(200), False),
        (Result(302), False),
        (Result(402), False),
        (Result(404), False),
        (Result(500), False),
        (Result(409), True),
        (Result(429), True),
        (Result(502), True),
        (Result(503), True),
        (Result(504), True),
        (Result(failure=Failure.UNSENT), True),
        (Result(failure=Failure.LOST), True),
    ],
)
def test_which_answers_are_retried(result: Result, retried: bool) -> None:
    assert decide(result).retry is retried


def test_the_retried_statuses_can_be_tuned() -> None:
    assert decide(Result(500), retried_statuses=frozenset({500})).retry
    assert not decide(Result(503), retried_statuses=frozenset({500})).retry


def test_retry_after_is_read_without_regard_to_case_and_ignored_when_unreadable() -> None:
    assert decide(Result(503, {"retry-after": "3"})).delay == 3.0
    assert decide(Result(503, {"Retry-After": "soon"})).delay == 0.5  # The backoff instead.
    # A date in the past: retry at once.
    past = "Wed, 21 Oct 2015 07:28:00 GMT"
    assert decide(Result(503, {"Retry-After": past})).delay == 0.0


@pytest.mark.parametrize(
    "value", ["²", "٣", "\uff11", "3.5", "-3", "+3", "1e3", "nan", "inf", "3 s", "0x10", "\x003"]
)
def test_a_retry_after_outside_its_grammar_is_ignored_not_an_error(value: str) -> None:
    # "²".isdigit() is true and float("²") raises: it answered 500 through the outbound client.
    assert decide(Result(503, {"Retry-After": value})).delay == 0.5  # The backoff instead.


def test_an_absurdly_long_retry_after_is_over_the_cap() -> None:
    decision = decide(Result(503, {"Retry-After": "9" * 400}))
    assert not decision.retry
    assert "over the cap" in decision.reason


@given(st.text(max_size=40))
@settings(max_examples=300, deadline=None, database=None)
def test_any_retry_after_gives_a_delay_or_none(value: str) -> None:
    waited = retry_after(value, 0.0)
    assert waited is None or waited >= 0.0


@pytest.mark.parametrize(
    ("option", "value"),
    [("max_attempts", 0), ("max_attempts", 1.5), ("deadline", -1), ("base_delay", "1")],
)
def test_a_policy_with_a_wrong_value_says_which(option: str, value: Any) -> None:
    with pytest.raises(ValueError, match=option):
        RetryPolicy(**{option: value})


@pytest.mark.parametrize(
    ("result", "earlier", "outcome"),
    [
        (Result(201), True, "confirmed"),
        (Result(402), True, "confirmed"),
        (Result(400), False, "failed"),
        (Result(400), True, "ambiguous"),
        (Result(503), False, "failed"),
        (Result(409), False, "ambiguous"),
        (Result(500), False, "ambiguous"),
        (Result(failure=Failure.UNSENT), False, "failed"),
        (Result(failure=Failure.UNSENT), True, "ambiguous"),
        (Result(failure=Failure.LOST), False, "ambiguous"),
    ],
)
def test_the_outcome_of_a_last_answer(result: Result, earlier: bool, outcome: str) -> None:
    assert outcome_of(result, earlier_may_have_run=earlier) == outcome
