"""The store contract: the tests every store passes, for a store of one's own to run too."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import ClassVar
from unittest import mock
from zoneinfo import ZoneInfo

import pytest
from django.conf import settings
from django.test import override_settings
from django.utils import timezone

from django_idempotency.conf import conf
from django_idempotency.core.outcomes import Claim, Outcome, Scope, StoredResponse, not_stored
from django_idempotency.http.problems import RESPONSE_NOT_STORED
from django_idempotency.http.responses import replay, without_body
from django_idempotency.stores.base import (
    BaseStore,
    ClaimRequest,
    PurgeOptions,
    PurgeResult,
    RecordLocked,
    UnstorableResponse,
    interleave,
    until_sent,
)

__all__ = ["StoreContract"]

FINGERPRINT = "a" * 64  # The request that claims a key.
OTHER_FINGERPRINT = "b" * 64  # Another request with the same key.
NAMESPACE = "store-contract"
RESPONSE = StoredResponse(201, [("Content-Type", "application/json")], b'{"id": 1}')
LATE = StoredResponse(201, [("Content-Type", "application/json")], b'{"id": "late"}')
MILLISECOND = timedelta(milliseconds=1)  # The finest step every shipped store keeps.
# How far the callers' wall clocks are set apart from the store's in the clock tests, and how
# closely two callers must still agree on the store's time: far above the shipped stores'
# precision (a clock reading's round trip), far below the skew.
SKEW = timedelta(seconds=30)
AGREEMENT = timedelta(seconds=1)


class StoreContract:
    """Subclass it in a test module, implement `make_store`, and pytest runs the contract.

    Each test claims its own fresh key in the namespace "store-contract", decides every moment
    itself (`now`, whole seconds, and steps of one millisecond), and drives interleavings with
    `stores.base.interleave`: the store must call `stores.base.between_steps("take-over")` where
    it takes over an abandoned record (between its read and its write, or before the one
    statement that does both), and a cache tier `between_steps("copy")` right before it writes a
    copy. A store kept in Django's database needs `@pytest.mark.django_db(transaction=True)` on
    the subclass: the interleaved steps commit one by one, as concurrent requests' would.
    """

    # Tests this store is known to fail, by name, each with the reason: marked as strict
    # expected failures, so that the day the store is fixed the run says to drop them.
    expected_failures: ClassVar[Mapping[str, str]] = {}

    def make_store(self) -> BaseStore:
        """A store to test, empty or at least without the keys the tests make up."""
        raise NotImplementedError("Implement make_store() to return the store under test.")

    def forget_record(self, store: BaseStore, scope: Scope) -> None:
        """Delete the record of `scope` and forget its copies, as the admin's "delete and
        forget" does. A store that cannot delete one record skips the tests that need it."""
        pytest.skip("forget_record() is not implemented for this store.")

    def record_locked(self, store: BaseStore, scope: Scope) -> AbstractContextManager[bool]:
        """A context in which another transaction (another connection's) holds the record of
        `scope` locked, as a view's own transaction does once it saved a step; it yields True.
        The default, for a store whose records no transaction can hold, yields False."""
        return contextlib.nullcontext(False)

    @pytest.fixture
    def store(self) -> Iterator[BaseStore]:
        """The store under test; override this fixture when it needs a set-up and tear-down."""
        yield self.make_store()

    @pytest.fixture
    def now(self) -> datetime:
        """The moment the test starts from: whole seconds, aware unless USE_TZ = False."""
        return timezone.now().replace(microsecond=0)

    @pytest.fixture
    def scope(self) -> Scope:
        return Scope(NAMESPACE, "", uuid.uuid4().hex)

    @pytest.fixture(autouse=True)
    def _known_defects(self, request: pytest.FixtureRequest) -> None:
        reason = self.expected_failures.get(request.function.__name__)
        if reason is not None:
            request.applymarker(pytest.mark.xfail(strict=True, reason=reason))

    # Helpers.

    @staticmethod
    def request(
        scope: Scope,
        now: datetime,
        *,
        fingerprint: str = FINGERPRINT,
        ttl: timedelta = timedelta(hours=1),
        lease: timedelta | None = timedelta(seconds=60),
    ) -> ClaimRequest:
        """A POST with the scope's key at `now`; leased unless `lease` is None (atomic)."""
        return ClaimRequest(scope, fingerprint, "POST", "/contract/", now, ttl, lease)

    @staticmethod
    def claim(store: BaseStore, request: ClaimRequest) -> Claim:
        """As the guard asks: the lookup first, then the claim if the lookup did not decide."""
        answer = store.lookup(request)
        return answer if answer is not None else store.begin(request)

    def outcome(self, store: BaseStore, request: ClaimRequest) -> Outcome:
        return self.claim(store, request).outcome

    def fresh(self, store: BaseStore, request: ClaimRequest) -> Claim:
        claim = self.claim(store, request)
        assert claim.outcome is Outcome.FRESH, claim
        return claim

    def completed(
        self, store: BaseStore, request: ClaimRequest, response: StoredResponse = RESPONSE
    ) -> Claim:
        """Claim the key for `request` and store `response` for it."""
        claim = self.fresh(store, request)
        assert store.complete(claim, response, request.now)
        return claim

    def completed_and_released(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> tuple[Claim, Claim]:
        """Two claims that ended: one completed (on `scope`), one released (on a key beside it)."""
        completed = self.completed(store, self.request(scope, now))
        other = Scope(scope.namespace, scope.owner, scope.key + "-released")
        released = self.fresh(store, self.request(other, now))
        assert store.release(released)
        return completed, released

    def assert_replays(
        self, store: BaseStore, request: ClaimRequest, response: StoredResponse
    ) -> None:
        answer = self.claim(store, request)
        assert answer.outcome is Outcome.REPLAY, answer
        assert answer.response == response

    def abandoned(self, store: BaseStore, scope: Scope, now: datetime) -> Claim:
        """A claim two hours before `now` whose 60-second lease ran out long ago; the record
        itself expires an hour after `now`."""
        two_hours_ago = now - timedelta(hours=2)
        return self.fresh(store, self.request(scope, two_hours_ago, ttl=timedelta(hours=3)))

    # The claim state machine.

    def test_a_new_key_is_claimed_then_in_progress_then_replayed(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        claim = self.fresh(store, self.request(scope, now))
        assert claim.lease_token and claim.scope == scope

        assert self.outcome(store, self.request(scope, now + MILLISECOND)) is Outcome.IN_PROGRESS
        assert store.complete(claim, RESPONSE, now + 2 * MILLISECOND)
        self.assert_replays(store, self.request(scope, now + 3 * MILLISECOND), RESPONSE)

    def test_another_request_with_the_key_is_a_mismatch_that_never_overwrites(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        claim = self.fresh(store, self.request(scope, now))
        other = self.request(scope, now + MILLISECOND, fingerprint=OTHER_FINGERPRINT)

        assert self.outcome(store, other) is Outcome.MISMATCH  # While in progress.
        assert store.complete(claim, RESPONSE, now + MILLISECOND)
        assert self.outcome(store, other) is Outcome.MISMATCH  # Once completed.
        self.assert_replays(store, self.request(scope, now + 2 * MILLISECOND), RESPONSE)

    def test_a_released_key_is_fresh_again_and_its_old_claim_acts_no_more(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        released = self.fresh(store, self.request(scope, now))
        assert store.release(released)

        again = self.fresh(store, self.request(scope, now + MILLISECOND))

        assert again.lease_token != released.lease_token
        assert not store.release(released)
        assert not store.complete(released, LATE, now + MILLISECOND)
        assert store.complete(again, RESPONSE, now + 2 * MILLISECOND)
        self.assert_replays(store, self.request(scope, now + 3 * MILLISECOND), RESPONSE)

    def test_a_release_after_the_completion_does_nothing(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        # A completion that was applied but seemed to fail is followed by a release: the
        # stored result must stay, or a retry would run the work a second time.
        claim = self.completed(store, self.request(scope, now))

        assert not store.release(claim)
        self.assert_replays(store, self.request(scope, now + MILLISECOND), RESPONSE)

    # Reads (django_idempotency.lookup).

    def test_a_read_finds_no_record_for_a_new_or_released_key_and_claims_nothing(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        assert store.read(scope) is None
        claim = self.fresh(store, self.request(scope, now))  # The read claimed nothing.
        assert store.release(claim)

        assert store.read(scope) is None

    def test_a_read_finds_a_claim_in_progress_with_its_request_and_lease(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        claim = self.fresh(store, self.request(scope, now))

        record = store.read(scope)

        assert record is not None
        assert (record.status, record.fingerprint, record.method, record.path) == (
            "in_progress",
            FINGERPRINT,
            "POST",
            "/contract/",
        )
        assert record.lease_expires_at == now + timedelta(seconds=60)
        assert record.expires_at == now + timedelta(hours=1)
        assert record.operation_id == claim.operation_id
        assert not record.abandoned(now + MILLISECOND)
        assert self.outcome(store, self.request(scope, now + MILLISECOND)) is Outcome.IN_PROGRESS

    def test_a_read_finds_the_completed_record_with_its_stored_response(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        self.completed(store, self.request(scope, now))

        record = store.read(scope)

        assert record is not None
        assert record.status == "completed"
        assert record.stored_response() == RESPONSE
        self.assert_replays(store, self.request(scope, now + MILLISECOND), RESPONSE)

    # Take-overs.

    def test_a_take_over_against_a_late_completion_replays(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        original = self.abandoned(store, scope, now)
        completed: list[bool] = []

        def original_completes() -> None:
            # Between the retry's read of the abandoned record and its take-over.
            if not completed:
                completed.append(store.complete(original, LATE, now))

        with interleave({"take-over": original_completes}):
            retry = self.claim(store, self.request(scope, now + MILLISECOND))

        assert completed == [True], "the store never called between_steps('take-over')"
        assert retry.outcome is Outcome.REPLAY, retry  # Never FRESH: the work ran already.
        assert retry.response == LATE

    def test_a_late_completion_against_a_take_over_is_refused(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        original = self.abandoned(store, scope, now)
        retry = self.fresh(store, self.request(scope, now))

        assert not store.complete(original, LATE, now + MILLISECOND)
        assert not store.release(original)
        assert self.outcome(store, self.request(scope, now + MILLISECOND)) is Outcome.IN_PROGRESS
        assert store.complete(retry, RESPONSE, now + 2 * MILLISECOND)
        self.assert_replays(store, self.request(scope, now + 3 * MILLISECOND), RESPONSE)

    def test_of_two_take_overs_of_one_abandoned_record_exactly_one_wins(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        original = self.abandoned(store, scope, now)
        other: list[Claim] = []
        steps: list[str] = []

        def another_retry_takes_over() -> None:
            steps.append("take-over")
            if len(steps) == 1:  # Not again when the other retry reaches the step itself.
                other.append(self.claim(store, self.request(scope, now)))

        with interleave({"take-over": another_retry_takes_over}):
            retry = self.claim(store, self.request(scope, now))

        assert other, "the store never called between_steps('take-over')"
        outcomes = sorted(claim.outcome.value for claim in (retry, *other))
        assert outcomes == [Outcome.FRESH.value, Outcome.IN_PROGRESS.value], outcomes
        winner = retry if retry.outcome is Outcome.FRESH else other[0]
        assert not store.complete(original, LATE, now + MILLISECOND)
        assert store.complete(winner, RESPONSE, now + MILLISECOND)
        self.assert_replays(store, self.request(scope, now + 2 * MILLISECOND), RESPONSE)

    # Renewal: a heartbeat extends the lease of a claim whose work still runs.

    def test_a_renewal_extends_the_lease_and_the_claim_says_until_when(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        start = now - timedelta(seconds=50)  # The 60-second lease has ten seconds left.
        claim = self.fresh(store, self.request(scope, start))
        until = now + timedelta(seconds=60)

        assert store.renew(claim, until)

        assert claim.lease_expires_at == until
        later = self.request(scope, now + timedelta(seconds=30))  # Past the first lease.
        assert self.outcome(store, later) is Outcome.IN_PROGRESS
        assert self.outcome(store, self.request(scope, until - MILLISECOND)) is (
            Outcome.IN_PROGRESS
        )
        self.fresh(store, self.request(scope, until))  # The renewed lease ran out: taken over.

    def test_a_renewed_claim_completes_and_replays(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        claim = self.fresh(store, self.request(scope, now - timedelta(seconds=50)))
        assert store.renew(claim, now + timedelta(seconds=60))

        assert store.complete(claim, RESPONSE, now + timedelta(seconds=30))
        self.assert_replays(store, self.request(scope, now + timedelta(seconds=31)), RESPONSE)

    def test_a_renewal_after_a_take_over_is_refused_and_changes_nothing(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        original = self.abandoned(store, scope, now)
        original_end = original.lease_expires_at
        retry = self.fresh(store, self.request(scope, now))
        retry_end = retry.lease_expires_at
        assert retry_end is not None

        assert not store.renew(original, now + timedelta(hours=1))

        assert original.lease_expires_at == original_end
        assert self.outcome(store, self.request(scope, retry_end - MILLISECOND)) is (
            Outcome.IN_PROGRESS
        )
        self.fresh(store, self.request(scope, retry_end))  # The retry's lease, not extended.

    def test_a_renewal_of_a_completed_or_released_claim_is_refused(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        completed, released = self.completed_and_released(store, scope, now)

        assert not store.renew(completed, now + timedelta(hours=2))
        assert not store.renew(released, now + timedelta(hours=2))

        self.assert_replays(store, self.request(scope, now + MILLISECOND), RESPONSE)
        assert released.scope is not None
        self.fresh(store, self.request(released.scope, now + MILLISECOND))  # Released stays so.

    def test_a_renewal_to_now_ends_the_lease(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        claim = self.fresh(store, self.request(scope, now))

        assert store.renew(claim, now)

        self.fresh(store, self.request(scope, now))

    def test_a_renewal_never_waits_for_a_transaction_holding_the_record(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        # The heartbeat renews every claim of its process in turn: a renewal waiting for one
        # record's lock would leave every other lease to run out.
        claim = self.fresh(store, self.request(scope, now))
        granted = claim.lease_expires_at
        assert granted is not None

        with self.record_locked(store, scope) as locked:
            if not locked:  # Nothing can hold the record: nothing to wait for.
                assert store.renew(claim, granted)
                return
            with pytest.raises(RecordLocked):
                store.renew(claim, now + timedelta(hours=1))

        assert claim.lease_expires_at == granted  # Not announced as renewed.
        assert self.outcome(store, self.request(scope, granted - MILLISECOND)) is (
            Outcome.IN_PROGRESS
        )
        assert store.renew(claim, now + timedelta(hours=1))  # The next beat renews it.
        assert self.outcome(store, self.request(scope, granted)) is Outcome.IN_PROGRESS

    def test_steps_saved_with_an_end_move_the_lease_on(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        claim = self.fresh(store, self.request(scope, now - timedelta(seconds=50)))
        until = now + timedelta(seconds=60)

        assert store.save_steps(claim, {"charge": b"1"}, until)

        assert claim.lease_expires_at == until
        before_its_end = self.request(scope, until - MILLISECOND)  # Past the claim's lease.
        assert self.outcome(store, before_its_end) is Outcome.IN_PROGRESS
        retry = self.fresh(store, self.request(scope, until))
        assert retry.steps == {"charge": b"1"}
        assert not store.save_steps(claim, {"late": b"1"}, until + timedelta(hours=1))
        assert retry.lease_expires_at is not None
        self.fresh(store, self.request(scope, retry.lease_expires_at))  # Not moved by it.

    # Stalls: a process paused past its lease renews it before its next side effect, fenced
    # by its token (refused after a take-over: see above); before any take-over it wins.

    def test_a_lease_renewed_after_its_end_before_any_take_over_holds_the_key_again(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        stalled = self.abandoned(store, scope, now)  # Its lease ran out; nobody retried yet.

        assert store.renew(stalled, now + timedelta(seconds=60))

        assert self.outcome(store, self.request(scope, now)) is Outcome.IN_PROGRESS
        assert store.complete(stalled, RESPONSE, now + MILLISECOND)
        self.assert_replays(store, self.request(scope, now + 2 * MILLISECOND), RESPONSE)

    def test_a_renewal_between_a_retrys_read_and_its_take_over_keeps_the_key(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        stalled = self.abandoned(store, scope, now)
        renewed: list[bool] = []

        def the_stalled_process_wakes_up() -> None:
            if not renewed:
                renewed.append(store.renew(stalled, now + timedelta(seconds=60)))

        with interleave({"take-over": the_stalled_process_wakes_up}):
            retry = self.claim(store, self.request(scope, now + MILLISECOND))

        assert renewed == [True], "the store never called between_steps('take-over')"
        assert retry.outcome is Outcome.IN_PROGRESS, retry  # Never FRESH: the work goes on.
        assert store.complete(stalled, RESPONSE, now + 2 * MILLISECOND)
        self.assert_replays(store, self.request(scope, now + 3 * MILLISECOND), RESPONSE)

    # Steps: what a lease-mode operation completed, for a retry after a crash to skip.

    def test_the_same_requests_take_over_carries_the_steps(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        original = self.abandoned(store, scope, now)
        steps = {"charge": b'{"id": 7}', "every-byte": bytes(range(256))}
        assert store.save_steps(original, {"charge": steps["charge"]})
        assert store.save_steps(original, steps)  # Every step so far, each time.

        retry = self.fresh(store, self.request(scope, now))

        assert retry.steps == steps
        assert not store.save_steps(original, {**steps, "late": b"1"})  # Fenced.
        assert store.save_steps(retry, {**steps, "ship": b"2"})
        assert store.complete(retry, RESPONSE, now + MILLISECOND)
        self.assert_replays(store, self.request(scope, now + 2 * MILLISECOND), RESPONSE)

    def test_a_fresh_claim_of_a_new_key_has_no_steps(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        assert self.fresh(store, self.request(scope, now)).steps == {}

    def test_another_requests_take_over_starts_without_the_steps(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        original = self.abandoned(store, scope, now)
        assert store.save_steps(original, {"charge": b"1"})

        other = self.fresh(store, self.request(scope, now, fingerprint=OTHER_FINGERPRINT))

        assert other.steps == {}
        assert store.release(other)
        # Nor does the first request's own retry find them: the other request replaced them.
        assert self.fresh(store, self.request(scope, now + MILLISECOND)).steps == {}

    def test_the_take_over_of_an_expired_completed_record_starts_without_steps(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        first = self.request(scope, now - timedelta(hours=2), ttl=timedelta(hours=1))
        claim = self.fresh(store, first)
        assert store.save_steps(claim, {"charge": b"1"})
        assert store.complete(claim, RESPONSE, first.now)

        assert self.fresh(store, self.request(scope, now)).steps == {}

    def test_steps_are_refused_once_the_claim_completed_or_was_released(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        completed, released = self.completed_and_released(store, scope, now)

        assert not store.save_steps(completed, {"late": b"1"})
        assert not store.save_steps(released, {"late": b"1"})
        self.assert_replays(store, self.request(scope, now + MILLISECOND), RESPONSE)

    # Operations: each record is one, with the identity its outbound keys derive from.

    def test_a_new_record_is_a_new_operation(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        beside = Scope(scope.namespace, scope.owner, scope.key + "-beside")
        first = self.fresh(store, self.request(scope, now))
        other = self.fresh(store, self.request(beside, now))
        assert store.release(first)

        again = self.fresh(store, self.request(scope, now + MILLISECOND))  # A released key.

        identities = [claim.operation_id for claim in (first, other, again)]
        assert all(isinstance(identity, str) and identity for identity in identities)
        assert len(set(identities)) == 3, identities

    def test_the_take_over_of_an_expired_record_is_a_new_operation(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        expired = self.completed(
            store, self.request(scope, now - timedelta(hours=2), ttl=timedelta(hours=1))
        )

        again = self.fresh(store, self.request(scope, now))

        assert again.operation_id and again.operation_id != expired.operation_id

    def test_the_same_requests_take_over_resumes_its_operation(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        original = self.abandoned(store, scope, now)

        retry = self.fresh(store, self.request(scope, now))
        assert retry.lease_expires_at is not None
        # The retry crashed too: the next one still resumes the same operation.
        third = self.fresh(store, self.request(scope, retry.lease_expires_at))

        assert original.operation_id
        assert retry.operation_id == third.operation_id == original.operation_id

    def test_another_requests_take_over_is_a_new_operation(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        original = self.abandoned(store, scope, now)

        other = self.fresh(store, self.request(scope, now, fingerprint=OTHER_FINGERPRINT))
        assert other.lease_expires_at is not None
        # The first request's retry, once the other request's attempt was abandoned in turn:
        # its own operation was replaced, so it starts another.
        back = self.fresh(store, self.request(scope, other.lease_expires_at))

        identities = [claim.operation_id for claim in (original, other, back)]
        assert all(identities) and len(set(identities)) == 3, identities
        assert back.steps == {}

    def test_a_resume_that_meets_a_late_completion_never_carries_the_old_operation_on(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        # Claimed two hours ago for one hour: by now expired, its lease long over.
        original = self.fresh(
            store, self.request(scope, now - timedelta(hours=2), ttl=timedelta(hours=1))
        )
        assert store.save_steps(original, {"charge": b"1"})
        completed: list[bool] = []

        def original_completes() -> None:
            # Between the retry's read of the abandoned attempt and its take-over: the
            # record is now completed and expired, free for a new operation.
            if not completed:
                completed.append(store.complete(original, LATE, now))

        with interleave({"take-over": original_completes}):
            retry = self.claim(store, self.request(scope, now + MILLISECOND))

        assert completed == [True], "the store never called between_steps('take-over')"
        assert retry.outcome in (Outcome.FRESH, Outcome.IN_PROGRESS), retry
        if retry.outcome is Outcome.FRESH:
            assert retry.operation_id and retry.operation_id != original.operation_id
            assert retry.steps == {}

    # Copies kept outside the store of record (the cache tier).

    def test_a_forget_between_a_replays_read_and_its_copy_is_not_undone(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        with until_sent():  # The first response is never sent: its copy is never made.
            self.completed(store, self.request(scope, now))
        with until_sent() as sent:
            read = self.claim(store, self.request(scope, now + MILLISECOND))
        assert read.outcome is Outcome.REPLAY

        self.forget_record(store, scope)
        for action in sent:  # The replay's response is sent: what waited for it runs.
            action()

        self.fresh(store, self.request(scope, now + 2 * MILLISECOND))

    def test_a_forget_at_the_copy_step_is_not_undone(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        with until_sent() as sent:
            self.completed(store, self.request(scope, now))
        forgotten: list[bool] = []

        def forget() -> None:
            if not forgotten:
                forgotten.append(True)
                self.forget_record(store, scope)

        with interleave({"copy": forget}):
            for action in sent:
                action()
        forget()  # A store that keeps no copies never reaches the step.

        self.fresh(store, self.request(scope, now + MILLISECOND))

    # Boundaries: `core.outcomes.is_abandoned` is the rule, at exactly `now`.

    def test_a_lease_runs_out_at_exactly_its_expiry(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        start = now - timedelta(minutes=10)
        claim = self.fresh(store, self.request(scope, start))
        assert claim.lease_expires_at == start + timedelta(seconds=60)
        ends = claim.lease_expires_at

        before = self.claim(store, self.request(scope, ends - MILLISECOND))
        at = self.claim(store, self.request(scope, ends))

        assert before.outcome is Outcome.IN_PROGRESS, before
        assert at.outcome is Outcome.FRESH, at

    def test_a_record_expires_at_exactly_its_expiry(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        first = self.request(scope, now - timedelta(hours=1), ttl=timedelta(hours=2))
        self.completed(store, first)
        expires = first.expires_at

        self.assert_replays(store, self.request(scope, expires - MILLISECOND), RESPONSE)
        self.fresh(store, self.request(scope, expires))

    def test_a_live_lease_outlives_a_shorter_ttl(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        self.fresh(store, self.request(scope, now, ttl=timedelta(seconds=5)))

        later = self.request(scope, now + timedelta(seconds=10))  # Expired, its lease live.
        assert self.outcome(store, later) is Outcome.IN_PROGRESS

    def test_a_purge_keeps_every_live_record(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        running = Scope(scope.namespace, scope.owner, scope.key + "-running")
        crashed = Scope(scope.namespace, scope.owner, scope.key + "-crashed")
        self.completed(store, self.request(scope, now))
        self.fresh(store, self.request(running, now))
        # Its lease ran out long ago, but its record lives an hour more: its retry may come.
        attempt = self.abandoned(store, crashed, now)

        store.purge(now + MILLISECOND, PurgeOptions(namespace=NAMESPACE))

        self.assert_replays(store, self.request(scope, now + MILLISECOND), RESPONSE)
        assert self.outcome(store, self.request(running, now + MILLISECOND)) is (
            Outcome.IN_PROGRESS
        )
        retry = self.fresh(store, self.request(crashed, now + MILLISECOND))
        assert retry.operation_id == attempt.operation_id

    def test_a_purge_keeps_a_crashed_attempt_until_its_record_expires(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        # A crashed attempt may have called another service: its retry must resume it, with
        # the identity its outbound keys derive from and its steps, as long as the record lives.
        expiring = Scope(scope.namespace, scope.owner, scope.key + "-expired")
        finished = Scope(scope.namespace, scope.owner, scope.key + "-finished")
        two_hours = timedelta(hours=2)
        # Both claimed two hours ago, their 60-second leases long over: one expires a
        # millisecond after the purge's `now`, the other at exactly that `now`.
        crashed = self.fresh(
            store, self.request(scope, now - two_hours, ttl=two_hours + MILLISECOND)
        )
        expired = self.fresh(store, self.request(expiring, now - two_hours, ttl=two_hours))
        for attempt in (crashed, expired):
            assert store.save_steps(attempt, {"charge": b'{"id": 7}'})
        self.completed(store, self.request(finished, now - two_hours, ttl=two_hours))

        purged = store.purge(now, PurgeOptions(namespace=NAMESPACE))

        retry = self.fresh(store, self.request(scope, now))
        assert (retry.operation_id, retry.steps) == (crashed.operation_id, {"charge": b'{"id": 7}'})
        if purged == PurgeResult():
            return  # A store whose records expire by themselves (Redis, by its TTL) purges none.
        # Past its expiry the attempt went with the purge, steps and identity: its retry is a
        # new operation (as a retry of an expired completed record is).
        again = self.fresh(store, self.request(expiring, now))
        assert again.operation_id not in ("", expired.operation_id)
        assert again.steps == {}
        assert purged.abandoned >= 1

    # Clocks: one clock decides, the store's (`now()`), whatever a caller's own clock says.

    def test_the_store_clock_reads_as_timezone_now_gives_a_moment(self, store: BaseStore) -> None:
        with override_settings(USE_TZ=True):
            aware = store.now()
        # Naive local time in a zone away from UTC: a store handing back naive UTC fails.
        with override_settings(USE_TZ=False, TIME_ZONE="America/Sao_Paulo"):
            naive = store.now()
            in_fact = naive.timestamp()  # Read as local time, as Django reads naive times.

        assert aware.utcoffset() == timedelta(0)
        assert naive.tzinfo is None
        assert abs(in_fact - aware.timestamp()) <= AGREEMENT.total_seconds()

    def test_callers_whose_clocks_differ_agree_on_the_store_clock(self, store: BaseStore) -> None:
        if not store.shared_between_processes:
            # A store of one process has no other caller: its clock is that process's own.
            with _wall_clock_shifted(SKEW):
                assert abs(store.now() - timezone.now()) <= AGREEMENT
            return
        with _wall_clock_shifted(SKEW):
            ahead = store.now()
        with _wall_clock_shifted(-SKEW):
            behind = self.make_store().now()  # Another instance, first read on this clock.
            ahead_again = store.now()

        assert abs(behind - ahead) <= AGREEMENT
        assert abs(ahead_again - ahead) <= AGREEMENT

    def test_a_caller_whose_clock_runs_ahead_never_takes_over_a_live_lease(
        self, store: BaseStore, scope: Scope
    ) -> None:
        lease = SKEW / 3
        if not store.shared_between_processes:
            # One process, one clock: what it says is the store's clock, lease ends included.
            with _wall_clock_shifted(SKEW):
                claim = self.fresh(store, self.request(scope, store.now(), lease=lease))
                live = self.request(scope, store.now() + lease / 2, lease=lease)
                assert self.outcome(store, live) is Outcome.IN_PROGRESS
                assert store.complete(claim, RESPONSE, store.now())
            return
        claim = self.fresh(store, self.request(scope, store.now(), lease=lease))

        with _wall_clock_shifted(SKEW):  # Past the lease's end, by the caller's own clock.
            retry = self.request(scope, store.now(), lease=lease)
            assert self.outcome(store, retry) is Outcome.IN_PROGRESS
            assert store.complete(claim, RESPONSE, store.now())

        self.assert_replays(store, self.request(scope, store.now()), RESPONSE)

    def test_a_clock_that_skips_an_hour_ends_no_lease_early(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        # Naive local time jumps an hour ahead when summer time starts: a lease across the
        # jump still runs its length, a record its TTL, in fact.
        with override_settings(USE_TZ=False, TIME_ZONE="Europe/Paris"):
            naive_now = timezone.make_naive(now) if timezone.is_aware(now) else now
            skipped = _next_skipped_hour(naive_now, ZoneInfo(settings.TIME_ZONE))
            assert skipped is not None
            before = skipped - timedelta(minutes=1)  # 01:59, then the clock reads 03:00.
            claim = self.fresh(
                store,
                self.request(scope, before, lease=timedelta(minutes=5), ttl=timedelta(hours=2)),
            )
            after = skipped + timedelta(hours=1, minutes=1)  # Two minutes later, in fact.

            assert self.outcome(store, self.request(scope, after)) is Outcome.IN_PROGRESS
            assert store.complete(claim, RESPONSE, after)
            # 01:59 + two hours, in fact, is 04:59 on the clock.
            self.assert_replays(store, self.request(scope, after + timedelta(hours=1)), RESPONSE)
            self.fresh(store, self.request(scope, before + timedelta(hours=3)))

    # Clocks that step or fold, as the callers pass them.

    def test_a_clock_that_steps_back_neither_takes_over_nor_loses_a_record(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        claim = self.fresh(store, self.request(scope, now))
        back = now - timedelta(minutes=10)  # Earlier than the claim was made.

        assert self.outcome(store, self.request(scope, back)) is Outcome.IN_PROGRESS
        other = self.request(scope, back, fingerprint=OTHER_FINGERPRINT)
        assert self.outcome(store, other) is Outcome.MISMATCH
        assert store.complete(claim, RESPONSE, back + MILLISECOND)
        self.assert_replays(store, self.request(scope, back + 2 * MILLISECOND), RESPONSE)

    def test_a_clock_that_folds_decides_by_its_naive_times(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        # Naive times are a store's only with USE_TZ = False: the test runs that way, in a time
        # zone that repeats an hour, whatever the project's settings.
        zone = (
            settings.TIME_ZONE if _next_repeated_hour(now, ZoneInfo(settings.TIME_ZONE)) else None
        )
        with override_settings(USE_TZ=False, TIME_ZONE=zone or "Europe/Paris"):
            naive_now = timezone.make_naive(now) if timezone.is_aware(now) else now
            fold = _next_repeated_hour(naive_now, ZoneInfo(settings.TIME_ZONE))
            assert fold is not None
            self._fold(store, scope, fold)

    def _fold(self, store: BaseStore, scope: Scope, fold: datetime) -> None:
        # Claimed in the first pass of the repeated hour; asked again in the second (fold=1),
        # later in fact, earlier on the clock: the naive times decide.
        first = self.request(scope, fold + timedelta(minutes=30), ttl=timedelta(hours=2))
        claim = self.fresh(store, first)

        def second_pass(minutes: int) -> datetime:
            return (fold + timedelta(minutes=minutes)).replace(fold=1)

        assert self.outcome(store, self.request(scope, second_pass(10))) is Outcome.IN_PROGRESS
        other = self.request(scope, second_pass(10), fingerprint=OTHER_FINGERPRINT)
        assert self.outcome(store, other) is Outcome.MISMATCH
        assert store.complete(claim, RESPONSE, second_pass(15))
        self.assert_replays(store, self.request(scope, second_pass(20)), RESPONSE)
        self.assert_replays(store, self.request(scope, first.expires_at - MILLISECOND), RESPONSE)
        self.fresh(store, self.request(scope, first.expires_at))

    # What is stored.

    @pytest.mark.parametrize(
        "response",
        [
            StoredResponse(200, [("Content-Type", "application/octet-stream")], bytes(range(256))),
            StoredResponse(200, [("Content-Type", "text/plain")], b""),
            StoredResponse(204),
            StoredResponse(
                402,
                [("X-Repeated", "1"), ("Location", "/charges/7"), ("X-Repeated", "2")],
                bytes(range(255, -1, -1)) * 3,
                reason="Payment Declined",
            ),
        ],
        ids=["every-byte", "empty", "no-content", "reason-and-repeated-headers"],
    )
    def test_a_stored_response_replays_exactly(
        self, store: BaseStore, scope: Scope, now: datetime, response: StoredResponse
    ) -> None:
        self.completed(store, self.request(scope, now), response)

        self.assert_replays(store, self.request(scope, now + MILLISECOND), response)

    def test_a_response_at_the_size_limit_replays_whole(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        limit = conf.MAX_STORED_BYTES
        if limit is None:
            pytest.skip("IDEMPOTENCY_MAX_STORED_BYTES = None: no limit to test.")
        body = (bytes(range(256)) * (limit // 256 + 1))[:limit]
        response = StoredResponse(201, [("Content-Type", "application/octet-stream")], body)

        self.completed(store, self.request(scope, now), response)

        self.assert_replays(store, self.request(scope, now + MILLISECOND), response)

    def test_a_response_over_the_size_limit_is_kept_without_its_body_and_answered_410(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        limit = conf.MAX_STORED_BYTES
        if limit is None:
            pytest.skip("IDEMPOTENCY_MAX_STORED_BYTES = None: no limit to test.")
        view_answered = StoredResponse(201, [("Location", "/charges/7")], b"x" * (limit + 1))
        given = without_body(view_answered)  # What the guard gives the store.

        self.completed(store, self.request(scope, now), given)

        answer = self.claim(store, self.request(scope, now + MILLISECOND))
        assert answer.outcome is Outcome.REPLAY and answer.response == given
        retried = replay(answer.response)
        assert retried.status_code == RESPONSE_NOT_STORED.status
        assert json.loads(retried.content)["type"].endswith(RESPONSE_NOT_STORED.slug)
        assert retried["Location"] == "/charges/7"

    # Refused results: once the work ran, its claim is never lost to a value the store refuses.

    @pytest.mark.parametrize(
        "response",
        [
            StoredResponse(200, [("Content-Disposition", 'attachment; filename="a\x00.pdf"')]),
            StoredResponse(200, [("X-Note", "ok")], b"", reason="Paid\x00"),
        ],
        ids=["nul-in-a-header", "nul-in-the-reason"],
    )
    def test_a_response_the_store_cannot_hold_is_refused_before_any_write_or_kept_exactly(
        self, store: BaseStore, scope: Scope, now: datetime, response: StoredResponse
    ) -> None:
        claim = self.fresh(store, self.request(scope, now))
        try:
            kept = store.complete(claim, response, now)
        except UnstorableResponse:
            # Refused before it was sent: the claim is still held, and takes what the store can.
            assert self.outcome(store, self.request(scope, now + MILLISECOND)) is (
                Outcome.IN_PROGRESS
            )
            smaller = not_stored(response, "refused")
            assert store.complete(claim, smaller, now)
            self.assert_replays(store, self.request(scope, now + MILLISECOND), smaller)
            return
        assert kept
        self.assert_replays(store, self.request(scope, now + MILLISECOND), response)

    # Atomic mode, for a store that holds claims in the view's transaction.

    def test_an_atomic_claim_commits_with_its_transaction_or_not_at_all(
        self, store: BaseStore, scope: Scope, now: datetime
    ) -> None:
        if not store.supports_atomic:
            # Lease mode only: the guard then holds no transaction for the claim, so the store
            # must open none of its own.
            with store.atomic() as owns_transaction:
                assert not owns_transaction
            return
        kept, discarded = scope, Scope(scope.namespace, scope.owner, scope.key + "-discarded")

        with store.atomic() as owns_transaction:
            claim = self.fresh(store, self.request(kept, now, lease=None))
            assert store.complete_last(claim, RESPONSE, now)
        with store.atomic():
            self.fresh(store, self.request(discarded, now, lease=None))
            store.discard()

        assert owns_transaction
        self.assert_replays(store, self.request(kept, now + MILLISECOND), RESPONSE)
        self.fresh(store, self.request(discarded, now + MILLISECOND))


@contextlib.contextmanager
def _wall_clock_shifted(by: timedelta) -> Iterator[None]:
    """This process's wall clock, as Python code reads it (`time.time`, `time.time_ns`,
    `django.utils.timezone.now`), moved `by` ahead (behind, if negative): a server whose clock
    differs from the store's."""
    seconds, moved = by.total_seconds(), timezone.now
    wall, wall_ns = time.time, time.time_ns
    with (
        mock.patch.object(time, "time", lambda: wall() + seconds),
        mock.patch.object(time, "time_ns", lambda: wall_ns() + int(seconds * 1e9)),
        mock.patch.object(timezone, "now", lambda: moved() + by),
    ):
        yield


def _next_skipped_hour(after: datetime, zone: ZoneInfo) -> datetime | None:
    """The naive start of the next hour `zone`'s clocks skip (the start of summer time)."""
    hour = after.replace(minute=0, second=0, microsecond=0, tzinfo=None)
    for _ in range(2 * 366 * 24):
        hour += timedelta(hours=1)
        # An hour that does not exist reads with winter's offset before the jump (fold=0).
        offsets = (
            hour.replace(tzinfo=zone).utcoffset(),
            hour.replace(tzinfo=zone, fold=1).utcoffset(),
        )
        assert offsets[0] is not None and offsets[1] is not None
        if offsets[0] < offsets[1]:
            return hour
    return None


def _next_repeated_hour(after: datetime, zone: ZoneInfo) -> datetime | None:
    """The naive start of the next hour `zone`'s clocks repeat (the end of summer time)."""
    hour = after.replace(minute=0, second=0, microsecond=0, tzinfo=None)
    for _ in range(2 * 366 * 24):
        hour += timedelta(hours=1)
        first, second = hour.replace(tzinfo=zone), hour.replace(tzinfo=zone, fold=1)
        offsets = first.utcoffset(), second.utcoffset()
        assert offsets[0] is not None and offsets[1] is not None
        if offsets[0] > offsets[1]:
            return hour
    return None
