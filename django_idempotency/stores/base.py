"""The store contract: begin a claim, complete or release it, purge what has expired."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.utils import timezone

from django_idempotency.core.keys import new_key
from django_idempotency.core.outcomes import (
    Claim,
    Outcome,
    Scope,
    Status,
    StoredResponse,
    classify,
    is_abandoned,
)
from django_idempotency.exceptions import StoreUnavailable
from django_idempotency.stores.clocks import later

__all__ = [
    "BaseStore",
    "ClaimRequest",
    "HeldKey",
    "PurgeOptions",
    "PurgeResult",
    "Record",
    "RecordLocked",
    "ResponseTooLarge",
    "StoreBusy",
    "StoreUnavailable",
    "UnstorableResponse",
    "after_response",
    "between_steps",
    "fresh_claim",
    "interleave",
    "new_operation_id",
    "until_sent",
]


class StoreBusy(Exception):
    """The store cannot take a claim right now, though it is reachable (SQLite's single writer
    is busy elsewhere): the request is answered as if its key were in progress."""


class RecordLocked(StoreUnavailable):
    """A write that would have waited for a lock another transaction holds on the record (the
    work's own transaction around a step, or one of the project's): not made. The store is
    reachable; like an unreachable one, it is tried again later (a lease renewal at the next
    beat), and the claim stays the caller's until its lease ends."""


class UnstorableResponse(Exception):
    """`complete` refused a response before writing anything: a value the store cannot hold
    (a NUL character in a header for PostgreSQL's JSON, say). The claim is still held, and
    still in progress: the caller completes it with what the store takes."""


class ResponseTooLarge(UnstorableResponse):
    """`complete` refused a response for its size (larger than the database takes in one
    statement). The claim is still held, and still in progress: the caller may complete it with
    less (the HTTP guard stores the status and headers without the body)."""


@dataclass
class PurgeResult:
    """What a purge deleted (or, in a dry run, would delete)."""

    expired: int = 0  # Records past their expiry.
    abandoned: int = 0  # In-progress claims past their expiry whose lease ran out.
    batches: int = 0

    @property
    def total(self) -> int:
        return self.expired + self.abandoned


@dataclass(frozen=True)
class PurgeOptions:
    """How a store's `purge` runs."""

    batch_size: int = 1000  # Records per batch; each batch is a transaction of its own.
    namespace: str | None = None  # Only this namespace's records; None: every namespace's.
    dry_run: bool = False  # Count what would be deleted, and delete nothing.
    progress: Callable[[PurgeResult], None] | None = None  # Given the counts after each batch.
    # Given each batch's scopes, to drop copies kept elsewhere; None: the store's `forget`.
    forget: Callable[[Iterable[Scope]], None] | None = None


ALL_AT_DEFAULTS = PurgeOptions()


@dataclass(frozen=True)
class ClaimRequest:
    """Everything `begin` needs to claim a key for one request."""

    scope: Scope
    fingerprint: str
    method: str
    path: str
    now: datetime
    ttl: timedelta
    lease: timedelta | None  # None: the claim lives inside the caller's transaction (atomic).

    @property
    def lease_expires_at(self) -> datetime | None:
        """When the lease this claim would take runs out; None in atomic mode."""
        return None if self.lease is None else later(self.now, self.lease)

    @property
    def expires_at(self) -> datetime:
        return later(self.now, self.ttl)


class BaseStore:
    """Subclass this to keep records elsewhere; point IDEMPOTENCY_STORE at the subclass.

    Contract:
    - `begin` claims the scope's key for this request and returns `Outcome.FRESH` with a lease
      token, or tells why not (`REPLAY` with the stored response, `IN_PROGRESS`, `MISMATCH`).
      An expired record, or an in-progress one whose lease has expired, is taken over atomically.
      It raises `StoreUnavailable` when the store cannot be reached.
    - `complete` stores the response, `release` forgets the claim; both act only if the claim's
      lease token still matches, and return whether they did. A store without row ids leaves
      `Claim.record_id` None and finds the claim's record by `Claim.scope`. `complete_last` is
      `complete` as the last statement of the transaction `atomic` opened: a store may send the
      commit with it.
    - `lookup` may answer a replay (or mismatch) from a faster copy before any transaction is
      opened; None sends the request on to `begin`.
    - `read` returns the record holding a scope's key as the store of record has it (a
      `HeldKey`: status, request, lease, expiry, stored response), or None; it claims nothing
      and waits on no lock. An in-progress record that only the claiming transaction can see
      yet (atomic mode) reads as None.
    - `purge` deletes expired records (`expires_at` at or before `now`) not held by a live
      lease, in short batches, each its own transaction, calling `forget` (by default
      `self.forget`) with each batch's scopes. An abandoned claim (in progress, lease run out)
      stays until it expires: the same request's retry resumes it, operation and steps. A
      backend that expires records itself returns an empty result.
    - `forget` drops any copies kept outside the store of record (the cache tier's).
    - Where reading a held key and taking it over are separate steps, the store calls
      `between_steps("take-over")` after the read that found the record abandoned and before
      the write that takes it over, and that write checks again, against the same `now`, that
      the record is still abandoned: what happened in between (a late completion, a rival
      retry) wins. Tests run a competing step exactly there with `interleave`.
    - `renew` sets the end of a lease-mode claim's lease to `until` (later, while the work runs;
      `now`, to end it) and `save_steps` stores the results of the steps the work completed
      (name: bytes; every step so far, a superset of what was saved before). Both act only while
      the claim still holds its lease token and is in progress, and return whether they did;
      `renew` then sets `claim.lease_expires_at`. Outside a transaction of the caller's (the
      heartbeat's renewals), `renew` never waits for a lock another transaction holds on the
      record: it raises `RecordLocked`, and is tried again at the next beat. `save_steps` with
      `until` also sets the lease's end to it in the same fenced write (and, if it acted,
      `claim.lease_expires_at`, as `renew` does): a step saved inside
      the caller's transaction keeps the record locked until that transaction ends, and nobody
      else can renew the lease meanwhile. Steps belong to the claim's record: purged
      with it, and carried (`Claim.steps`) only by the FRESH claim that takes over an
      abandoned in-progress record of the same request (fingerprint, method and path). A store
      without them raises NotImplementedError: its leases are not renewed, and steps refused.
    - Every record is an operation with an identity (`Claim.operation_id` of its FRESH claim,
      from `new_operation_id`), kept with the record: new whenever a record is written for a
      new operation (a new key, and the take-over of an expired, completed or another request's
      record), and carried on, as the steps are, only by the take-over that resumes the same
      request's abandoned attempt. Outbound keys derive from it.
    - `now` is the store's current time, as `django.utils.timezone.now()` gives a moment
      (aware UTC with USE_TZ, naive local time without). Every `now` the callers pass (to
      `begin`, `complete`, `renew`'s `until`, `purge`) is read from it, so that servers whose
      own clocks differ agree on when a lease or a record ends. The default is the process's
      clock: right for a store that one process keeps; a store that servers share returns its
      own (`stores.clocks.StoreClock` reads it now and then and counts the time in between).
    - `atomic` is the transaction atomic mode runs the view in. It yields whether it opened that
      transaction itself; if so, `discard` rolls the view's work back with the claim. If not (a
      caller's transaction was already open) the claim joins it, and is released on failure.
    """

    supports_atomic = False
    # False for a store whose records live in one process's memory (the memory store): the HTTP
    # guard refuses it under a server that says several processes serve the site.
    shared_between_processes = True
    # True for a store whose connections, under gevent, belong to the thread that opened them
    # and are shared by the process's threads: the heartbeat, a native thread there, then
    # cannot renew its leases. Django's database connections are each thread's own; the Redis
    # store opens a client of the heartbeat thread's own (`threads.native_under_gevent`).
    greenlet_bound_connections = False

    def now(self) -> datetime:
        """The store's current time: the one clock that decides when leases and records end."""
        return timezone.now()

    def lookup(self, request: ClaimRequest) -> Claim | None:
        return None

    def read(self, scope: Scope) -> HeldKey | None:
        """The record that holds the scope's key as it stands, read without claiming or locking
        it (`django_idempotency.lookup`); None where there is none."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot read a record without claiming its key: implement"
            " read(scope) to serve django_idempotency.lookup() and wait_for()."
        )

    def begin(self, request: ClaimRequest) -> Claim:
        raise NotImplementedError

    def complete(self, claim: Claim, response: StoredResponse, now: datetime) -> bool:
        raise NotImplementedError

    def complete_last(self, claim: Claim, response: StoredResponse, now: datetime) -> bool:
        """`complete`, when nothing follows it in the transaction `atomic` opened."""
        return self.complete(claim, response, now)

    def release(self, claim: Claim) -> bool:
        raise NotImplementedError

    def renew(self, claim: Claim, until: datetime) -> bool:
        raise NotImplementedError

    def save_steps(
        self, claim: Claim, steps: Mapping[str, bytes], until: datetime | None = None
    ) -> bool:
        raise NotImplementedError

    def purge(self, now: datetime, options: PurgeOptions = ALL_AT_DEFAULTS) -> PurgeResult:
        raise NotImplementedError

    def claims_privately(self) -> bool:
        """Whether a claim made now stays unseen by other connections until the caller's
        transaction commits (a lease-mode claim under ATOMIC_REQUESTS): nobody can take it over
        meanwhile, so its lease is not renewed."""
        return False

    def forget(self, scopes: Iterable[Scope]) -> None:
        """Nothing is kept elsewhere by default."""

    @contextlib.contextmanager
    def atomic(self) -> Iterator[bool]:
        yield False

    def discard(self) -> None:
        """Roll back the work done inside `atomic`, claim included."""

    def after_commit(self, action: Callable[[], None]) -> None:
        """Run `action` once the work of `complete` is durable (at once, by default)."""
        action()


def new_operation_id() -> str:
    """The identity of a new operation: a ULID, minted with its record."""
    return new_key()


def fresh_claim(
    request: ClaimRequest,
    token: str,
    record_id: int | None = None,
    steps: Mapping[str, bytes] | None = None,
    operation_id: str | None = None,
) -> Claim:
    """The claim of a request that now holds its key under `token` (in the record `record_id`,
    for a store with row ids), with the `steps` it carries from an attempt it took over, for
    the operation `operation_id` the record keeps (a new one if the store keeps none: then a
    resumed attempt is a new operation to the APIs it calls)."""
    return Claim(
        Outcome.FRESH,
        record_id=record_id,
        lease_token=token,
        lease_expires_at=request.lease_expires_at,
        scope=request.scope,
        fingerprint=request.fingerprint,
        expires_at=request.expires_at,
        method=request.method,
        path=request.path,
        steps=dict(steps or {}),
        operation_id=new_operation_id() if operation_id is None else operation_id,
    )


class HeldKey:
    """What the record holding a key means for a request: one rule for every store's record."""

    fingerprint: str
    method: str
    path: str
    status: str
    lease_expires_at: datetime | None
    expires_at: datetime
    operation_id: str  # Empty for a record made before identities were kept.

    def stored_response(self) -> StoredResponse:
        raise NotImplementedError

    def resumed_by(self, request: ClaimRequest) -> bool:
        """Whether taking this abandoned record over for `request` resumes its work: the same
        request's attempt, still in progress (its worker gone), whose steps then carry over."""
        return self.status == Status.IN_PROGRESS and (self.fingerprint, self.method, self.path) == (
            request.fingerprint,
            request.method,
            request.path,
        )

    def operation_for(self, request: ClaimRequest) -> str:
        """The identity of the operation that taking this abandoned record over for `request`
        runs: the record's own when it resumes it, a new one for any other take-over."""
        return self.operation_id if self.resumed_by(request) else new_operation_id()

    def abandoned(self, now: datetime) -> bool:
        """Free to take over: expired, or in progress with its lease run out."""
        return is_abandoned(
            status=self.status,
            expires_at=self.expires_at,
            lease_expires_at=self.lease_expires_at,
            now=now,
        )

    def answer(self, request: ClaimRequest) -> Claim:
        """What this record, holding the key and not abandoned, means for the request."""
        outcome = classify(
            status=self.status,
            expires_at=self.expires_at,
            now=request.now,
            same_request=(self.fingerprint, self.method, self.path)
            == (request.fingerprint, request.method, request.path),
        )
        if outcome is not Outcome.REPLAY:
            return Claim(outcome)  # A 409 or a 422: the outcome is all there is to answer.
        # What a replay answers with, and what the cache tier keeps of it.
        return Claim(
            outcome,
            response=self.stored_response(),
            scope=request.scope,
            fingerprint=self.fingerprint,
            expires_at=self.expires_at,
            method=self.method,
            path=self.path,
        )


@dataclass(frozen=True)
class Record(HeldKey):
    """A record as a store without SQL keeps it (memory) or reads it back (Redis)."""

    fingerprint: str
    method: str
    path: str
    status: str
    lease_token: str
    lease_expires_at: datetime | None
    created_at: datetime
    expires_at: datetime
    response: StoredResponse | None = None
    steps: Mapping[str, bytes] = field(default_factory=dict)
    operation_id: str = ""

    def stored_response(self) -> StoredResponse:
        return self.response or StoredResponse(200)


# Work a store leaves until the guarded response has gone to the client (see `until_sent`).
_after_response: ContextVar[list[Callable[[], None]] | None] = ContextVar(
    "django_idempotency_after_response", default=None
)


def after_response(action: Callable[[], None]) -> None:
    """Run `action`, which no answer waits for (a copy to the cache tier), once the response
    being guarded is sent; at once outside a guarded response."""
    pending = _after_response.get()
    if pending is None:
        action()
    else:
        pending.append(action)


@contextlib.contextmanager
def until_sent() -> Iterator[list[Callable[[], None]]]:
    """Collect the `after_response` actions of a block, for the caller to run once its
    response is sent. Nothing depends on them: those of a block that raises are dropped."""
    pending: list[Callable[[], None]] = []
    token = _after_response.set(pending)
    try:
        yield pending
    finally:
        _after_response.reset(token)


_interleavings: ContextVar[Mapping[str, Callable[[], None]] | None] = ContextVar(
    "django_idempotency_interleavings", default=None
)


def between_steps(step: str) -> None:
    """Run the callback a test installed for `step` (see `interleave`); nothing otherwise."""
    callbacks = _interleavings.get()
    if callbacks is not None and step in callbacks:
        callbacks[step]()


@contextlib.contextmanager
def interleave(callbacks: Mapping[str, Callable[[], None]]) -> Iterator[None]:
    """Run each callback when a store reaches its step: deterministic interleavings for tests."""
    token = _interleavings.set(callbacks)
    try:
        yield
    finally:
        _interleavings.reset(token)
