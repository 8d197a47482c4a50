"""The Celery tasks behind the beat entries (the purge, the outbox's relay, the recovery sweep);
without Celery installed it defines no task."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django_idempotency import purge, recovery
from django_idempotency.exceptions import StoreUnavailable
from django_idempotency.outbox.relay import BATCH_SIZE, Relay
from django_idempotency.recovery import BATCH_SIZE as RECOVERY_BATCH_SIZE

# A purge that finds the database down is retried after 1, 2, 4, 8, then 15 minutes; after the
# last retry it fails with the StoreUnavailable message, and the next beat tick starts afresh.
RETRY_DELAY = 60
MAX_RETRY_DELAY = 15 * 60
MAX_RETRIES = 5


def retry_countdown(retries: int) -> int:
    """Seconds before retry number `retries` + 1: doubling, capped at MAX_RETRY_DELAY."""
    return int(min(RETRY_DELAY * 2**retries, MAX_RETRY_DELAY))


try:
    from celery import shared_task  # type: ignore[import-untyped]
except ImportError:  # Celery is optional: the command purges without it.
    pass
else:

    @shared_task(  # type: ignore[untyped-decorator]
        name="django_idempotency.tasks.purge_expired_records", bind=True, max_retries=MAX_RETRIES
    )
    def purge_expired_records(
        self: Any, batch_size: int = 1000, namespace: str | None = None
    ) -> dict[str, Any]:
        """Run `django_idempotency.purge.purge_expired_records`; the result is its report.

        A lost database is an outage, not a bug: the task is retried (see RETRY_DELAY).
        """
        try:
            report = purge.purge_expired_records(batch_size=batch_size, namespace=namespace)
        except StoreUnavailable as exc:
            raise self.retry(exc=exc, countdown=retry_countdown(self.request.retries)) from exc
        return asdict(report)

    @shared_task(  # type: ignore[untyped-decorator]
        name="django_idempotency.tasks.relay_outbox", bind=True, ignore_result=False
    )
    def relay_outbox(
        self: Any, batch_size: int = BATCH_SIZE, max_batches: int = 10
    ) -> dict[str, Any]:
        """Relay the outbox's due messages, at most `max_batches` batches (the next tick goes
        on); task messages are sent through this task's own Celery app. The result is the
        relay's report."""
        runner = Relay(batch_size=batch_size, app=self.app)
        try:
            report = runner.run(max_batches=max_batches)
        finally:
            runner.close()
        return asdict(report)

    @shared_task(  # type: ignore[untyped-decorator]
        name="django_idempotency.tasks.recover_operations", bind=True, ignore_result=False
    )
    def recover_operations(self: Any, batch_size: int = RECOVERY_BATCH_SIZE) -> dict[str, Any]:
        """Call again the recover=True calls whose worker was lost (`recovery`); tasks run in
        this worker, through this task's own app. The result is the sweep's report."""
        return asdict(recovery.recover_operations(batch_size=batch_size, app=self.app))
