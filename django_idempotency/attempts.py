"""One claim on a key, from begin to complete or release: shared by views, functions and tasks."""

from __future__ import annotations

import collections
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import replace
from datetime import datetime, timedelta
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING

from asgiref.sync import sync_to_async
from django.dispatch import Signal
from django.utils import timezone

from django_idempotency import crashes, signals
from django_idempotency.conf import OnConflict, conf
from django_idempotency.core.keys import key_hash
from django_idempotency.core.outcomes import (
    Claim,
    Outcome,
    Scope,
    StoredResponse,
    is_not_stored,
    not_stored,
)
from django_idempotency.encryption import seal, seal_step, unseal, unseal_step
from django_idempotency.exceptions import LeaseLost
from django_idempotency.leases import Hold, heartbeat
from django_idempotency.stores import (
    BaseStore,
    ClaimRequest,
    ResponseTooLarge,
    StoreBusy,
    StoreUnavailable,
    UnstorableResponse,
    get_store,
)
from django_idempotency.stores.clocks import later

if TYPE_CHECKING:
    from django.http import HttpRequest

logger = logging.getLogger("django_idempotency")

FIRST_DELAY = 0.01  # Seconds a waiting duplicate waits before its second try.
# A step or outbound call that finds less than this part of its lease left renews it first:
# the heartbeat renews it a third of the way through, so this little left means that the
# heartbeat could not (the process stalled, or its thread was starved or blocked).
RENEW_BELOW = 0.5
# Seconds that renewal waits for one of the heartbeat's under way to end.
HEARTBEAT_WAIT = 1.0

_TAKEN_OVER = (
    "This attempt's idempotency lease was taken over by another caller (its lease ran out while"
    " this process stalled, or could not renew it): stop here, before the next side effect; the"
    " new owner runs the work."
)

_SIGNALS: dict[Outcome, Signal] = {
    Outcome.FRESH: signals.claimed,
    Outcome.REPLAY: signals.replayed,
    Outcome.IN_PROGRESS: signals.conflict,
    Outcome.MISMATCH: signals.mismatch,
}
# Each signal's name: what the log records and the metrics' `outcome` label say.
_NAMES: dict[Signal, str] = {signal: name for name, signal in signals.BY_OUTCOME.items()}

# The attempt whose claim the running code holds: set while its work runs, so that code called
# from a guarded view, an idempotent function or task can find the operation it is part of.
_current: ContextVar[Attempt | None] = ContextVar("django_idempotency_attempt", default=None)


def current_attempt() -> Attempt | None:
    """The attempt holding a claim for the work running now (innermost first), or None."""
    return _current.get()


@contextlib.contextmanager
def restore_current_attempt() -> Iterator[None]:
    """On leaving, make current again the attempt that was current on entering: for a caller
    that hands the work (and the end of its claim) to another asyncio task, whose context is a
    copy of the caller's, so that ending the claim there leaves it current here."""
    before = _current.get()
    try:
        yield
    finally:
        _current.set(before)


class Attempt:
    """Claim a key, then store the result or give the key back.

    Used as a context manager it holds atomic mode's transaction open from `begin` to the end of
    the block: the claim, the caller's own writes and the stored result commit together, and an
    exception rolls all of them back (or, in a caller's transaction, releases the claim).
    """

    def __init__(
        self,
        *,
        atomic: bool,
        on_conflict: OnConflict,
        request: HttpRequest | None = None,
        poll: bool = False,
    ) -> None:
        self.store: BaseStore = get_store()
        self.request = request  # Given to signal receivers; None outside HTTP.
        self.atomic = atomic and self.store.supports_atomic
        self.on_conflict = on_conflict
        # poll: the caller waits between tries itself (async views, with asyncio.sleep), so
        # `begin` tries once and leaves announcing the conflict to `announce_conflict`.
        self.poll = poll
        self.waits = on_conflict == "wait" and not poll
        self.claim: Claim | None = None
        self.scope: Scope | None = None
        self.owns_transaction = False  # Atomic mode opened its own: a rollback undoes the work.
        self.store_lost = False  # A release failed because the store could not be reached.
        self._transaction = contextlib.ExitStack()
        self._outer: Attempt | None = None  # The attempt current before this one claimed.
        self._hold: Hold | None = None  # Its lease's renewals, while the claim is held.
        self.lost = False  # A renewal found the claim taken over: its result is not stored.
        self._lease: timedelta | None = None  # The claim's lease; None in atomic mode.
        # The steps this operation completed (name: stored result), its earlier attempts' too.
        self.steps: dict[str, bytes] = {}
        # The identity of the operation this attempt runs (`Claim.operation_id`), kept once the
        # claim ends: an outbound key may be derived from it late.
        self.operation_id: str | None = None
        # Outbound keys were derived from that identity (`outbound.key_for`): a call may have
        # carried one downstream, so a failing attempt keeps its record, as once steps are
        # stored, for the same request's retry to send the same keys.
        self.identity_shared = False
        # Outbox messages this attempt wrote, by step and destination: the n-th of each gets the
        # same derived key on every run of the operation, so a resumed run's is the same message.
        # None until its first message: an attempt that writes none allocates nothing.
        self.outbox_written: collections.Counter[tuple[str, str]] | None = None
        # The request's forms sent with its key, judged (`forms.IdempotentFormMixin`): invalid
        # ones only, and its answer (a form shown again, with the same key) is not stored.
        self.invalid_forms = 0
        self.valid_forms = 0

    @property
    def changed_nothing(self) -> bool:
        """Its request's only judgement was an invalid form's: the view did no work."""
        return bool(self.invalid_forms) and not self.valid_forms

    def __enter__(self) -> Attempt:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            self.abort()
        if _current.get() is self:
            # Left with the claim still held (a caller that neither completed nor released it):
            # code running after the block in this thread or task is not part of its work.
            _current.set(self._outer)
        self._transaction.__exit__(exc_type, exc, tb)  # Commits, or rolls back on an error.

    def claim_key(
        self,
        scope: Scope,
        fingerprint: str,
        *,
        method: str,
        path: str,
        ttl: timedelta,
        lease: timedelta | None = None,
    ) -> Claim:
        """`begin` for this request or call, now: leased (`lease`, by default
        IDEMPOTENCY_LEASE) unless atomic mode holds the claim."""
        return self.begin(
            ClaimRequest(
                scope=scope,
                fingerprint=fingerprint,
                method=method,
                path=path,
                now=self.store.now(),
                ttl=ttl,
                lease=None if self.atomic else lease or conf.LEASE,
            )
        )

    def begin(self, request: ClaimRequest) -> Claim:
        """Claim the key; with on_conflict="wait", retry with backoff until the deadline.

        Raises `StoreUnavailable` when the store cannot be reached, and `UnreadableResponse`
        when the stored response to replay is encrypted with a key no longer configured.
        """
        self.scope = request.scope
        started = time.perf_counter()
        claim = self._begin(request)
        if claim.response is not None:
            # Stores and the cache tier only ever hold the sealed form (a copy still pending to
            # the cache keeps it): opened in a claim of the caller's own (when sealed at all).
            opened = unseal(claim.response, conf.ENCRYPTION_KEYS)
            if opened is not claim.response:
                claim = replace(claim, response=opened)
        if claim.outcome is Outcome.FRESH:
            self.claim = claim
            self._lease = request.lease
            self.steps = dict(claim.steps)
            self.operation_id = claim.operation_id
            self._outer = _current.get()
            _current.set(self)
            self._keep_alive(request.lease)
            crashes.reached("claimed")
        if not (self.poll and claim.outcome is Outcome.IN_PROGRESS):
            duration = time.perf_counter() - started
            self._announce(_SIGNALS[claim.outcome], duration)
        return claim

    def _keep_alive(self, lease: timedelta | None) -> None:
        """Have the heartbeat renew a leased claim while the work runs. Not a claim inside the
        caller's transaction (ATOMIC_REQUESTS): nobody else sees it before it commits, so
        nobody can take it over, and a renewal from another connection would not find it."""
        if lease is None or self.atomic or not conf.LEASE_RENEWAL:
            return
        if self.store.claims_privately():
            return
        self._hold = heartbeat().hold(self, lease)

    def lose(self) -> None:
        """The claim was taken over or ended by someone else (a renewal found it so): the work
        stops at its next step or outbound call, and its result is not stored."""
        self.lost = True

    def announce_conflict(self, duration: float) -> None:
        """A polling caller gives up waiting: the conflict `begin` left unannounced."""
        self._announce(signals.conflict, duration)

    def _begin(self, request: ClaimRequest) -> Claim:
        store = self.store
        answer = store.lookup(request)
        if answer is not None and (answer.outcome is not Outcome.IN_PROGRESS or not self.waits):
            return answer  # Decided without opening a transaction.
        deadline = time.monotonic() + conf.WAIT_TIMEOUT.total_seconds()
        delay = FIRST_DELAY
        while True:
            try:
                if self.atomic:
                    self.owns_transaction = self._transaction.enter_context(store.atomic())
                claim = store.begin(request)
            except StoreBusy:
                claim = Claim(Outcome.IN_PROGRESS)
            remaining = deadline - time.monotonic()
            if claim.outcome is not Outcome.IN_PROGRESS or not self.waits:
                return claim
            if remaining <= 0:
                return claim
            # Hold no transaction while waiting: the first request may need to finish its own.
            self._transaction.close()
            time.sleep(min(delay, remaining))
            delay = next_delay(delay)
            request = replace(request, now=store.now())

    def complete(
        self,
        result: StoredResponse,
        smaller: Callable[[StoredResponse], StoredResponse] | None = None,
    ) -> bool:
        """Store the result for every retry; False if the lease was lost to another caller, or
        (atomic mode) the transaction was marked for rollback. `smaller`: what to store instead
        of a result the store refuses for its size.

        The work has run by now, so the key is never given back: a result the store refuses
        (for its size, or a value it cannot hold) is kept as smaller, else as a record that says
        it could not be stored (`not_stored`), which retries are answered with.

        Raises `StoreUnavailable`: at once in atomic mode (the caller's writes are then lost with
        it); in lease mode only once the lease has ended without the store coming back.
        """
        crashes.reached("completing")
        lost = self.lost
        claim = self._end()
        if claim is None:
            return False
        if lost:
            logger.warning(
                "A renewal of this lease found the key taken over by another caller; this result"
                " was not stored. The work stopped at its next step or outbound call, if any."
            )
            return False
        plain = result
        # Sealed once, here, so that every store and the cache tier keep the same ciphertext.
        result = seal(plain, conf.ENCRYPTION_KEYS)
        # Our own transaction ends with the completion: the store may commit with it.
        complete = self.store.complete_last if self.owns_transaction else self.store.complete
        delay = 0.05
        while True:
            try:
                kept = complete(claim, result, self._now_for_completion())
                break
            except UnstorableResponse as exc:
                # Refused before anything was written: the claim is intact, and in atomic mode
                # so is the transaction. Keep the outcome in a form the store takes.
                plain, smaller = self._storable(plain, smaller, exc), None
                result = seal(plain, conf.ENCRYPTION_KEYS)
            except StoreUnavailable as exc:
                if self.owns_transaction:
                    self.store.discard()
                    raise
                # Lease mode: the work is done and cannot be undone, and until the lease ends
                # nobody else can take the key over. Keep trying to store the result meanwhile,
                # so that an outage shorter than the lease does not cost a second run.
                expires = claim.lease_expires_at  # None in atomic mode: no point retrying.
                left = (expires - self._now_for_completion()).total_seconds() if expires else 0.0
                if left <= delay:
                    raise
                if delay == 0.05:
                    logger.warning(
                        "The store is unreachable; retrying to store the result for up to %.0f s "
                        "(until the lease ends): %s",
                        left,
                        exc,
                    )
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
            except Exception as exc:
                # A value the store refused that it could not foresee. Inside a transaction the
                # error dooms it, the claim with the work's writes: nothing happened, and the
                # error goes on. Otherwise the claim is intact: keep that the work ran.
                if self.atomic or self.store.claims_privately() or is_not_stored(plain):
                    raise
                plain, smaller = self._storable(plain, None, exc), None
                result = seal(plain, conf.ENCRYPTION_KEYS)
        if kept:
            crashes.reached("completed")
            self._announce(signals.completed)
        elif self.atomic:
            logger.warning(
                "The transaction was marked for rollback (transaction.set_rollback): nothing of "
                "it is kept, the idempotency claim included, and a retry runs the work again."
            )
            self._announce(signals.released)
        else:
            logger.warning(
                "The lease expired and another caller took the key over; this result was not "
                "stored. Raise IDEMPOTENCY_LEASE above the work's longest run."
            )
        return kept

    @staticmethod
    def _storable(
        plain: StoredResponse,
        smaller: Callable[[StoredResponse], StoredResponse] | None,
        refusal: Exception,
    ) -> StoredResponse:
        """What to store instead of a result the store refused: `smaller` for one refused for
        its size, once; else a record that it could not be stored. Never the key given back:
        a retry would run the work again."""
        if isinstance(refusal, ResponseTooLarge) and smaller is not None:
            logger.warning("%s Stored without its body.", refusal)
            return smaller(plain)
        if is_not_stored(plain):
            raise refusal  # Even the record of it was refused: the lease will end the claim.
        logger.warning(
            "The result could not be stored (%s); a record that it ran was kept instead, which "
            "retries are answered with.",
            refusal,
        )
        return not_stored(plain, str(refusal))

    def _now_for_completion(self) -> datetime:
        """The store's time; the process's when the store's clock was never read and cannot
        be now (the store is gone): the completion is fenced by the claim's token, so a time
        off by the clocks' difference only moves when it gives up retrying."""
        try:
            return self.store.now()
        except StoreUnavailable:
            return timezone.now()

    def ensure_lease(self) -> None:
        """Raise `LeaseLost` if this attempt no longer holds its claim: call it before a side
        effect (an outbound call, a step), so that work whose key was taken over stops there.

        The heartbeat's `lost` flag is not enough: a process paused whole (SIGSTOP, a GC or VM
        pause) past its lease wakes up with the flag still clear, its heartbeat paused too. So
        the lease's end is compared with the store's clock, and a lease near or past its end is
        renewed here, fenced by the claim's token: refused, the key was taken over meanwhile.
        """
        claim = self.claim
        if claim is None:
            raise LeaseLost("This attempt no longer holds its idempotency claim.")
        if self.lost:
            raise LeaseLost(_TAKEN_OVER)
        lease, ends = self._lease, claim.lease_expires_at
        if lease is None or ends is None:
            return  # Atomic mode: the claim commits with the work, and nobody can take it over.
        if ends - self.store.now() > lease * RENEW_BELOW:
            return
        self._renew_before_effect(claim, lease)

    async def aensure_lease(self) -> None:
        """`ensure_lease` for async code: the store calls it may make run in a thread."""
        await sync_to_async(self.ensure_lease)()

    def _renew_before_effect(self, claim: Claim, lease: timedelta) -> None:
        """Renew a lease the heartbeat left near its end, or stop the work (`LeaseLost`)."""
        hold = self._hold
        # A renewal of the heartbeat's may be under way, its end computed before a stall: it
        # must not land after this one and bring the lease's end back. Wait for it, a while
        # (a heartbeat stuck in the store must not stop the work).
        locked = hold is not None and hold.renewing.acquire(timeout=HEARTBEAT_WAIT)
        try:
            if self.lost:
                raise LeaseLost(_TAKEN_OVER)
            ends, now = claim.lease_expires_at, self.store.now()
            if ends is not None and ends - now > lease * RENEW_BELOW:
                return  # The heartbeat renewed it meanwhile.
            try:
                renewed = self.store.renew(claim, later(now, lease))
            except (StoreUnavailable, NotImplementedError) as exc:
                if ends is not None and ends > self.store.now():
                    return  # Still this attempt's until its end; the heartbeat tries again.
                raise LeaseLost(
                    "This attempt's idempotency lease ran out and could not be renewed"
                    f" ({str(exc) or type(exc).__name__}): stop here, before the next side effect."
                    " The key may have been taken over; a retry runs the work from its last"
                    " stored step."
                ) from exc
        finally:
            if locked:
                assert hold is not None
                hold.renewing.release()
        if not renewed:
            self.lose()
            raise LeaseLost(_TAKEN_OVER)

    def save_step(self, name: str, result: bytes) -> None:
        """Store a completed step's result (sealed as responses are) for a retry to skip it:
        one fenced write. Raises `LeaseLost` if the claim is no longer this attempt's.

        Inside a transaction of the caller's, that write keeps the record locked until the
        transaction ends, and the heartbeat, which never waits for such a lock, cannot renew
        the lease meanwhile. So the write also moves the lease's end on, and the lease the
        transaction commits is current; once it commits, the lease is renewed at once.
        """
        self.ensure_lease()
        claim = self.claim
        assert claim is not None
        steps = {**self.steps, name: seal_step(result, conf.ENCRYPTION_KEYS)}
        hold = self._hold
        # A renewed claim made outside any transaction, saved inside one of the caller's now
        # (what `claims_privately` tells: a transaction is open on the store's connection).
        if hold is not None and self.store.claims_privately():
            saved = self.store.save_steps(claim, steps, later(self.store.now(), hold.lease))
            if saved:
                self.store.after_commit(partial(heartbeat().renew_now, hold))
        else:
            saved = self.store.save_steps(claim, steps)
        if not saved:
            self.lose()
            raise LeaseLost(
                f"The result of step {name!r} was not stored: the idempotency claim was taken"
                " over by another caller, which runs the work from its last stored step."
            )
        self.steps = steps

    def stored_step(self, name: str) -> bytes | None:
        """The result of step `name` if this operation completed it before, opened."""
        stored = self.steps.get(name)
        return None if stored is None else unseal_step(stored, conf.ENCRYPTION_KEYS)

    def _end(self) -> Claim | None:
        """The claim, which this attempt no longer holds from now on."""
        claim, self.claim = self.claim, None
        if self._hold is not None:
            heartbeat().end(self._hold)  # Before the claim's last write: never renewed after.
            self._hold = None
        if claim is not None and _current.get() is self:
            _current.set(self._outer)
        return claim

    def _let_go(self, claim: Claim) -> bool:
        """Give the key back. Once steps are stored, or outbound keys derived, the record stays
        with its lease ended instead, so that the client's retry takes it over and resumes the
        same operation: after those steps, with the same keys."""
        if self.steps or self.identity_shared:
            try:
                return self.store.renew(claim, self.store.now())
            except NotImplementedError:
                # A store without leases to end: the claim ends with its lease, and the retry
                # that takes it over then resumes. Released, the steps would go with it.
                return False
        return self.store.release(claim)

    def release(self, *, rollback: bool = True) -> None:
        """Give the key back; with ``rollback``, our own transaction's writes go with it."""
        claim = self._end()
        if claim is None:
            return
        if rollback and self.owns_transaction:
            self.store.discard()
        else:
            let_go, failure = _quietly(self._let_go, claim)
            self.store_lost = isinstance(failure, StoreUnavailable)
            if not let_go:
                return  # Taken over, or the store is lost: nothing was released here.
        self._announce(signals.released)

    def abort(self) -> None:
        """The work raised: give the key back (a rollback of our own transaction does that)."""
        if self.claim is not None:
            if self.owns_transaction:
                self._end()  # Leaving the transaction with the error rolls the claim back.
                self._announce(signals.released)
            else:
                self.release()

    def _announce(self, signal: Signal, duration: float | None = None) -> None:
        scope = self.scope
        assert scope is not None
        if logger.isEnabledFor(logging.INFO):
            outcome = _NAMES[signal]
            hashed = key_hash(scope.key)
            logger.info(
                "idempotency %s namespace=%s key_hash=%s",
                outcome,
                scope.namespace,
                hashed,
                extra={
                    "idempotency_outcome": outcome,
                    "idempotency_namespace": scope.namespace,
                    "idempotency_key_hash": hashed,
                },
            )
        # A receiver that raises must not fail the request or call: Django's send_robust
        # catches it and logs it (logger "django.dispatch", with the traceback).
        signal.send_robust(
            sender=Attempt,
            request=self.request,
            namespace=scope.namespace,
            owner=scope.owner,
            key=scope.key,
            duration=duration,
        )


def next_delay(delay: float) -> float:
    """Backoff between tries of a waiting duplicate, from FIRST_DELAY up to a quarter second."""
    return min(delay * 2, 0.25)


def _quietly(action: Callable[[Claim], bool], claim: Claim) -> tuple[bool, Exception | None]:
    """Release on a failure path: never mask the error that got us here. Whether the claim
    was let go, and the failure if the store raised."""
    try:
        let_go = action(claim)
    except Exception as exc:  # An aborted transaction or a lost store: the lease will expire.
        logger.error("Could not release an idempotency claim: %s", exc)
        return False, exc
    if not let_go:
        # Fenced by the claim's token: another caller holds the key now (the lease ran out and
        # it was taken over), and its record was left as it is.
        logger.warning(
            "An idempotency claim was not released: the key was taken over by another caller."
        )
    return let_go, None
