"""The Celery task behind the purge beat entry; without Celery installed it defines no task."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django_idempotency import purge

try:
    from celery import shared_task  # type: ignore[import-untyped]
except ImportError:  # Celery is optional: the command purges without it.
    pass
else:

    @shared_task(name="django_idempotency.tasks.purge_expired_records")  # type: ignore[untyped-decorator]
    def purge_expired_records(
        batch_size: int = 1000, namespace: str | None = None
    ) -> dict[str, Any]:
        """Run `django_idempotency.purge.purge_expired_records`; the result is its report."""
        report = purge.purge_expired_records(batch_size=batch_size, namespace=namespace)
        return asdict(report)
