"""What a paid order sets off, its e-mail and its shipment, written to the outbox with it."""

from __future__ import annotations

from django.conf import settings

from django_idempotency.outbox import enqueue_request, enqueue_task
from testproject.payments.models import Payment

# Named, not imported: the demo and its checkout run without Celery installed.
CONFIRMATION_TASK = "testproject.payments.tasks.send_receipt"
# The warehouse under `manage.py runserver`, where settings name none (the test settings).
WAREHOUSE_URL = "http://127.0.0.1:8000/warehouse/shipments/"


def follow_up(payment: Payment) -> None:
    """Write the order's confirmation e-mail and its shipment into the outbox, in the
    transaction that saves `payment`: the relay sends both once it commits, never if it rolls
    back.

    Inside the guarded checkout each message's key derives from the checkout's, the same on
    every run of it. The e-mail task runs under that key as its id, and the warehouse gets it
    as the Idempotency-Key: a message sent twice mails once and ships once.
    """
    enqueue_task(CONFIRMATION_TASK, [payment.pk])
    # The order's later messages (a cancellation, a new address) would go after this one, in
    # order. The e-mail stays out of it: a worker down must hold no parcel back.
    enqueue_request(
        "POST",
        getattr(settings, "DEMO_WAREHOUSE_URL", WAREHOUSE_URL),
        json_body={"order": payment.pk},
        aggregate=f"order-{payment.pk}",
    )
