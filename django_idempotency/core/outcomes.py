"""The claim state machine: what a stored record means for a request that brings the same key."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime


class Outcome(enum.Enum):
    """What `begin` decided for a request."""

    FRESH = "fresh"  # This request owns the key now: run the work.
    REPLAY = "replay"  # A completed result exists for the same request: return it.
    IN_PROGRESS = "in_progress"  # Another request holds the key right now.
    MISMATCH = "mismatch"  # The key was used for a different request.


class Status(enum.StrEnum):
    """The life cycle of a stored record."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"


@dataclass(frozen=True)
class StoredResponse:
    """What is kept of a completed request, enough to replay it byte for byte."""

    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    reason: str = ""  # A reason phrase the view chose; empty for the status's standard one.


# The only header of the record of a result the store refused (a value it cannot hold): its
# value says why. Not a field name (RFC 9110 tokens have no colon), so no view can set it.
NOT_STORED_HEADER = ":not-stored"


def not_stored(result: StoredResponse, why: str) -> StoredResponse:
    """What is kept of a result the store refused: its status, and that it ran."""
    return StoredResponse(result.status, [(NOT_STORED_HEADER, why[:200])])


def is_not_stored(result: StoredResponse) -> bool:
    return bool(result.headers) and result.headers[0][0] == NOT_STORED_HEADER


@dataclass(frozen=True)
class Scope:
    """Where a key lives: keys of different namespaces or owners never meet."""

    namespace: str
    owner: str
    key: str


@dataclass
class Claim:
    """The answer of `begin`: the outcome, and what the caller needs to finish or replay."""

    outcome: Outcome
    record_id: int | None = None
    lease_token: str | None = None
    response: StoredResponse | None = None
    lease_expires_at: datetime | None = None
    # What a cache tier needs to keep a completed record: set on FRESH and REPLAY claims.
    scope: Scope | None = None
    fingerprint: str | None = None
    expires_at: datetime | None = None
    method: str = ""
    path: str = ""
    # Steps a crashed attempt of the same operation completed (name: stored result), carried
    # by the FRESH claim that took its record over; empty for every other claim.
    steps: dict[str, bytes] = field(default_factory=dict)
    # The identity of the operation a FRESH claim runs (a ULID): new with every new record, the
    # one it carries on when it resumes the same request's crashed attempt; outbound keys derive
    # from it. Empty for a record made before identities were kept; None on other claims.
    operation_id: str | None = None


def is_abandoned(
    *, status: str, expires_at: datetime, lease_expires_at: datetime | None, now: datetime
) -> bool:
    """Free for the next request (and for the purge): expired, or claimed by a request whose
    lease ran out.

    A live lease is never abandoned, even past `expires_at` (a TTL shorter than the lease):
    its request may still be running, and taking it over would run the work twice.
    """
    if status == Status.IN_PROGRESS and lease_expires_at is not None:
        return lease_expires_at <= now
    return expires_at <= now


def classify(*, status: str, expires_at: datetime, now: datetime, same_request: bool) -> Outcome:
    """Decide what an existing record, not abandoned, means for a new request with its key.

    ``same_request``: the stored fingerprint, method and path all equal the new request's.
    A completed record seen here past its expiry is being taken over by a concurrent request
    a moment ago, so it counts as in progress.
    """
    if status == Status.COMPLETED and expires_at <= now:
        return Outcome.IN_PROGRESS
    if not same_request:
        return Outcome.MISMATCH
    if status == Status.COMPLETED:
        return Outcome.REPLAY
    return Outcome.IN_PROGRESS
