"""The claim state machine's rules, at their boundaries: exactly "now" belongs to the past."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from django_idempotency.core.outcomes import Outcome, Status, classify, is_abandoned

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
TICK = timedelta(microseconds=1)
IN_PROGRESS, COMPLETED = Status.IN_PROGRESS.value, Status.COMPLETED.value


@pytest.mark.parametrize(
    ("expires_at", "abandoned"), [(NOW - TICK, True), (NOW, True), (NOW + TICK, False)]
)
def test_a_completed_record_is_free_from_the_moment_it_expires(
    expires_at: datetime, abandoned: bool
) -> None:
    assert (
        is_abandoned(status=COMPLETED, expires_at=expires_at, lease_expires_at=None, now=NOW)
        is abandoned
    )


@pytest.mark.parametrize(
    ("lease_expires_at", "abandoned"), [(NOW - TICK, True), (NOW, True), (NOW + TICK, False)]
)
def test_a_claim_is_free_from_the_moment_its_lease_ends(
    lease_expires_at: datetime, abandoned: bool
) -> None:
    far = NOW + timedelta(days=1)
    assert (
        is_abandoned(status=IN_PROGRESS, expires_at=far, lease_expires_at=lease_expires_at, now=NOW)
        is abandoned
    )


@pytest.mark.parametrize("expires_at", [NOW - timedelta(days=1), NOW])
def test_a_live_lease_is_never_abandoned_past_its_expiry(expires_at: datetime) -> None:
    assert not is_abandoned(
        status=IN_PROGRESS, expires_at=expires_at, lease_expires_at=NOW + TICK, now=NOW
    )


@pytest.mark.parametrize(
    ("expires_at", "abandoned"), [(NOW - TICK, True), (NOW, True), (NOW + TICK, False)]
)
def test_an_atomic_claim_without_lease_lives_until_it_expires(
    expires_at: datetime, abandoned: bool
) -> None:
    assert (
        is_abandoned(status=IN_PROGRESS, expires_at=expires_at, lease_expires_at=None, now=NOW)
        is abandoned
    )


@pytest.mark.parametrize(
    ("expires_at", "outcome"),
    [(NOW - TICK, Outcome.IN_PROGRESS), (NOW, Outcome.IN_PROGRESS), (NOW + TICK, Outcome.REPLAY)],
)
def test_a_completed_record_replays_until_exactly_its_expiry(
    expires_at: datetime, outcome: Outcome
) -> None:
    assert classify(status=COMPLETED, expires_at=expires_at, now=NOW, same_request=True) is outcome


@pytest.mark.parametrize(
    ("status", "same_request", "outcome"),
    [
        (COMPLETED, True, Outcome.REPLAY),
        (COMPLETED, False, Outcome.MISMATCH),
        (IN_PROGRESS, True, Outcome.IN_PROGRESS),
        (IN_PROGRESS, False, Outcome.MISMATCH),
    ],
)
def test_what_a_live_record_means_for_a_new_request(
    status: str, same_request: bool, outcome: Outcome
) -> None:
    later = NOW + timedelta(hours=1)
    assert classify(status=status, expires_at=later, now=NOW, same_request=same_request) is outcome


def test_an_expired_record_being_taken_over_is_in_progress_even_for_another_request() -> None:
    assert (
        classify(status=COMPLETED, expires_at=NOW, now=NOW, same_request=False)
        is Outcome.IN_PROGRESS
    )
