"""The recovery sweep: calls again the `recover=True` calls whose lease ended uncompleted."""

from __future__ import annotations

import importlib
import json
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from django_idempotency.conf import conf
from django_idempotency.core.keys import key_hash
from django_idempotency.core.outcomes import Scope, Status
from django_idempotency.encryption import unseal_step
from django_idempotency.exceptions import KeyInProgress, KeyMismatch
from django_idempotency.outbound.policy import RetryPolicy
from django_idempotency.recoverable import (
    DECLARED,
    FAILED,
    RUNNING,
    TASK,
    check_store,
    kept_calls,
)
from django_idempotency.stores import get_store
from django_idempotency.stores.clocks import later

if TYPE_CHECKING:
    from django_idempotency.models import RecoverableOperation

logger = logging.getLogger("django_idempotency")


BATCH_SIZE = 100
# Recoveries of one call before it is marked failed, and the backoff between them (full
# jitter, doubling from 10 s to 10 min).
POLICY = RetryPolicy(max_attempts=5, base_delay=10.0, max_delay=600.0, deadline=float("inf"))


@dataclass
class RecoveryReport:
    """What one sweep did."""

    recovered: int = 0  # Called again, and completed.
    retried: int = 0  # Called again, and failed: looked at again after the backoff.
    failed: int = 0  # Given up after the policy's attempts: the admin shows them.
    waiting: int = 0  # Still held by a live lease: looked at again when it ends.
    cleared: int = 0  # Completed, given back or expired meanwhile: nothing to recover.


def recover_operations(
    *, batch_size: int = BATCH_SIZE, policy: RetryPolicy = POLICY, app: Any = None
) -> RecoveryReport:
    """Call again, with their arguments, the `recover=True` calls whose lease ended without
    their completing; each resumes after its stored steps, with its outbound keys. Tasks run in
    this process (``task.apply`` with their task's id), through `app` (Celery's current app by
    default)."""
    if type(batch_size) is not int or batch_size < 1:
        raise ValueError(f"batch_size must be an int of 1 or more, not {batch_size!r}.")
    check_store()
    store = get_store()
    report = RecoveryReport()
    now = store.now()
    due = kept_calls().filter(state=RUNNING, next_attempt_at__lte=now)
    for row in list(due.order_by("next_attempt_at")[:batch_size]):
        scope = Scope(row.namespace, row.owner, row.key)
        hashed = key_hash(row.key)
        held = store.read(scope)
        if held is None or held.status == Status.COMPLETED:
            row.delete()
            report.cleared += 1
            continue
        lease_end = held.lease_expires_at
        if lease_end is not None and lease_end > now:
            kept_calls().filter(pk=row.pk).update(next_attempt_at=lease_end)
            report.waiting += 1
            continue
        if row.attempts >= policy.max_attempts:
            kept_calls().filter(pk=row.pk).update(state=FAILED, updated_at=now)
            report.failed += 1
            logger.error(
                "recover=True call %s (key_hash=%s) failed after %d recoveries: %s",
                row.target,
                hashed,
                row.attempts,
                row.last_error,
            )
            continue
        arguments = json.loads(unseal_step(bytes(row.arguments), conf.ENCRYPTION_KEYS))
        renamed = _renamed(row, scope, arguments, app)
        if renamed:
            # Called, it would claim another key and run as a new operation, this one still
            # abandoned: a key or owner read from somewhere other than the arguments.
            kept_calls().filter(pk=row.pk).update(state=FAILED, last_error=renamed, updated_at=now)
            report.failed += 1
            logger.error("recover=True call %s (key_hash=%s): %s", row.target, hashed, renamed)
            continue
        attempts = row.attempts + 1
        # Counted before the call: a sweep that dies in it has used the attempt up.
        retry_at = later(now, timedelta(seconds=policy.backoff(attempts)))
        kept_calls().filter(pk=row.pk).update(attempts=attempts, next_attempt_at=retry_at)
        try:
            _call_again(row, arguments, app)
        except (KeyInProgress, KeyMismatch) as exc:
            # Another sweep (or the caller) runs it now; or its key was since used for another
            # call, which this one may not resume: looked at again later, as any failure.
            _note(row, exc)
            report.retried += 1
        except Exception as exc:
            _note(row, exc)
            report.retried += 1
            logger.warning(
                "recover=True call %s (key_hash=%s) failed again: %s", row.target, hashed, exc
            )
        else:
            report.recovered += 1
    return report


def retry_failed(ids: list[int]) -> int:
    """Give failed calls their attempts back, for the next sweep (the admin's action)."""
    return (
        kept_calls()
        .filter(pk__in=ids, state=FAILED)
        .update(state=RUNNING, attempts=0, next_attempt_at=timezone.now(), last_error="")
    )


def _callable(row: RecoverableOperation, app: Any) -> Any:
    """The task (from `app`, Celery's current app by default) or the function to call again;
    finding it declares it (imports its module) if this process had not yet."""
    if row.kind == TASK:
        if app is None:
            from celery import current_app  # type: ignore[import-untyped]

            app = current_app
        return app.tasks[row.target]
    module, _, name = row.target.partition(":")
    function: Any = importlib.import_module(module)
    for part in name.split("."):
        function = getattr(function, part)
    return function


def _renamed(row: RecoverableOperation, scope: Scope, arguments: dict[str, Any], app: Any) -> str:
    """Why the kept arguments no longer name the kept call's key; empty when they do."""
    try:
        _callable(row, app)
    except (ImportError, AttributeError, KeyError) as exc:
        return f"{row.target} cannot be found to call it again: {exc}"[:255]
    declared = DECLARED.get(row.target)
    if declared is None:
        return f"{row.target} is no longer declared with recover=True"
    try:
        named = declared.scope_of(arguments["args"], arguments["kwargs"], arguments.get("task_id"))
    except Exception as exc:
        return f"its arguments no longer fit {row.target}: {exc}"[:255]
    if named != scope:
        return (
            "its arguments name another key or owner now (read from somewhere other than the "
            "arguments?): calling it would start a new operation"
        )
    return ""


def _call_again(row: RecoverableOperation, arguments: dict[str, Any], app: Any) -> None:
    args, kwargs = arguments["args"], arguments["kwargs"]
    target = _callable(row, app)
    if row.kind == TASK:
        target.apply(args=args, kwargs=kwargs, task_id=arguments.get("task_id"), throw=True)
    else:
        target(*args, **kwargs)


def _note(row: RecoverableOperation, exc: Exception) -> None:
    kept_calls().filter(pk=row.pk).update(last_error=f"{type(exc).__name__}: {exc}"[:255])
