"""The memory store: records in one process's memory, for tests and single-process development."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime

from django_idempotency.core.outcomes import (
    Claim,
    Outcome,
    Scope,
    Status,
    StoredResponse,
)
from django_idempotency.exceptions import StoreNotSupported
from django_idempotency.stores.base import (
    ALL_AT_DEFAULTS,
    BaseStore,
    ClaimRequest,
    PurgeOptions,
    PurgeResult,
    Record,
    between_steps,
    fresh_claim,
    new_operation_id,
)


class MemoryStore(BaseStore):
    """A dict behind a lock. Other processes never see its records, and a restart forgets them:
    not for production (`check --deploy` refuses it). Lease mode only, like the Redis store."""

    supports_atomic = False
    shared_between_processes = False

    def __init__(self) -> None:
        self.records: dict[Scope, Record] = {}
        self._lock = threading.Lock()
        # A server's forked worker inherits the store with a copy of its records: each worker
        # would then claim the same key in its own copy and run the view again.
        self._pid = os.getpid()

    def begin(self, request: ClaimRequest) -> Claim:
        if os.getpid() != self._pid:
            raise StoreNotSupported(
                f"The memory store was created in process {self._pid} and is used in process"
                f" {os.getpid()} (a forked worker): processes do not share its records, so a"
                " retry reaching another worker would run the view again. Use the database store"
                " (the default) or django_idempotency.stores.redis.RedisStore under a server"
                " with several worker processes."
            )
        now = request.now
        with self._lock:
            record = self.records.get(request.scope)
            if record is None:
                return self._claim(request, new_operation_id())
            if not record.abandoned(now):
                return record.answer(request)
            carried = record.steps if record.resumed_by(request) else {}
            operation_id = record.operation_for(request)
        # The take-over is a step of its own, as on a store other processes share: it happens
        # only if the record is still the one read (compare and set), whatever came between.
        between_steps("take-over")
        with self._lock:
            current = self.records.get(request.scope)
            if current is record:
                return self._claim(request, operation_id, carried)
        if current is None or current.abandoned(now):
            return Claim(Outcome.IN_PROGRESS)  # Released, or taken over and lost again, since.
        return current.answer(request)

    def read(self, scope: Scope) -> Record | None:
        return self.records.get(scope)

    def _claim(
        self, request: ClaimRequest, operation_id: str, steps: Mapping[str, bytes] | None = None
    ) -> Claim:
        """Write the request's claim for the operation `operation_id` over whatever holds the
        key, with the `steps` it carries over; lock held."""
        token = uuid.uuid4().hex
        steps = dict(steps or {})
        self.records[request.scope] = Record(
            fingerprint=request.fingerprint,
            method=request.method,
            path=request.path,
            status=Status.IN_PROGRESS.value,
            lease_token=token,
            lease_expires_at=request.lease_expires_at,
            created_at=request.now,
            expires_at=request.expires_at,
            steps=steps,
            operation_id=operation_id,
        )
        return fresh_claim(request, token, steps=steps, operation_id=operation_id)

    def complete(self, claim: Claim, response: StoredResponse, now: datetime) -> bool:
        assert claim.scope is not None
        with self._lock:
            record = self._own(claim)
            if record is None:
                return False
            self.records[claim.scope] = replace(
                record,
                status=Status.COMPLETED.value,
                lease_expires_at=None,
                response=response,
            )
        return True

    def release(self, claim: Claim) -> bool:
        assert claim.scope is not None
        with self._lock:
            record = self._own(claim)
            # Once completed, the claim's token releases nothing: the result stays stored.
            if record is None or record.status != Status.IN_PROGRESS:
                return False
            del self.records[claim.scope]
        return True

    def renew(self, claim: Claim, until: datetime) -> bool:
        assert claim.scope is not None
        with self._lock:
            record = self._own(claim)
            if record is None or record.status != Status.IN_PROGRESS:
                return False
            self.records[claim.scope] = replace(record, lease_expires_at=until)
        claim.lease_expires_at = until
        return True

    def save_steps(
        self, claim: Claim, steps: Mapping[str, bytes], until: datetime | None = None
    ) -> bool:
        assert claim.scope is not None
        with self._lock:
            record = self._own(claim)
            if record is None or record.status != Status.IN_PROGRESS:
                return False
            ends = record.lease_expires_at if until is None else until
            self.records[claim.scope] = replace(record, steps=dict(steps), lease_expires_at=ends)
        if until is not None:
            claim.lease_expires_at = until
        return True

    def purge(self, now: datetime, options: PurgeOptions = ALL_AT_DEFAULTS) -> PurgeResult:
        """Expired records not held by a live lease go in one batch (a dict needs no batching):
        `models.purgeable`'s rule, so an abandoned claim stays until it expires, for its retry."""
        result = PurgeResult()
        with self._lock:
            gone = [
                (scope, record)
                for scope, record in self.records.items()
                if record.expires_at <= now
                and record.abandoned(now)
                and options.namespace in (None, scope.namespace)
            ]
            for scope, record in gone:
                if record.status == Status.COMPLETED:
                    result.expired += 1
                else:
                    result.abandoned += 1
                if not options.dry_run:
                    del self.records[scope]
        if gone and not options.dry_run:
            result.batches = 1
            (options.forget or self.forget)(scope for scope, _ in gone)
            if options.progress is not None:
                options.progress(result)
        return result

    def _own(self, claim: Claim) -> Record | None:
        """The claim's record while it still carries the claim's token (fencing); lock held."""
        assert claim.scope is not None
        record = self.records.get(claim.scope)
        return record if record is not None and record.lease_token == claim.lease_token else None
