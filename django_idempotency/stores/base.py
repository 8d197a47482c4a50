"""The store contract: begin a claim, complete or release it, purge what has expired."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from django_idempotency.core.outcomes import Claim, Scope, StoredResponse


class StoreUnavailable(Exception):
    """The store cannot be reached; requests are refused rather than run unprotected."""


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


class BaseStore:
    """Subclass this to keep records elsewhere; point IDEMPOTENCY_STORE at the subclass.

    Contract:
    - `begin` claims the scope's key for this request and returns `Outcome.FRESH` with a lease
      token, or tells why not (`REPLAY` with the stored response, `IN_PROGRESS`, `MISMATCH`).
      An expired record, or an in-progress one whose lease has expired, is taken over atomically.
      It raises `StoreUnavailable` when the store cannot be reached.
    - `complete` stores the response, `release` forgets the claim; both act only if the claim's
      lease token still matches, and return whether they did.
    - `purge` deletes expired records and abandoned claims in short batches.
    - `atomic` is the transaction atomic mode runs the view in. It yields whether it opened that
      transaction itself; if so, `discard` rolls the view's work back with the claim. If not (a
      caller's transaction was already open) the claim joins it, and is released on failure.
    """

    supports_atomic = False

    def begin(self, request: ClaimRequest) -> Claim:
        raise NotImplementedError

    def complete(self, claim: Claim, response: StoredResponse, now: datetime) -> bool:
        raise NotImplementedError

    def release(self, claim: Claim) -> bool:
        raise NotImplementedError

    def purge(self, now: datetime, *, batch_size: int = 1000, namespace: str | None = None) -> int:
        raise NotImplementedError

    @contextlib.contextmanager
    def atomic(self) -> Iterator[bool]:
        yield False

    def discard(self) -> None:
        """Roll back the work done inside `atomic`, claim included."""
