"""A small payments API that shows django-idempotency at work."""

from __future__ import annotations

from importlib.util import find_spec

# Load the Celery app with Django so that `celery -A testproject` and @shared_task find it; the
# demo itself runs without Celery installed.
if find_spec("celery") is not None:
    from testproject.celery import app as celery_app

    __all__ = ["celery_app"]
