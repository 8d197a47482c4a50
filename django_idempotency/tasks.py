"""The Celery task behind the purge beat entry; without Celery installed it defines no task."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django_idempotency import purge
from django_idempotency.exceptions import StoreUnavailable

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
