"""POST /warehouse/shipments/: the warehouse the shop ships from, shipping once per key.

Another service in a real shop; the demo serves it itself. The shop's checkout writes each
order's shipment into the outbox, and the relay sends it here with the message's key.
"""

from __future__ import annotations

import json

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from django_idempotency import idempotent
from testproject.payments.models import Shipment

MAX_ORDER = 2**63 - 1  # A PositiveBigIntegerField's largest value on every database.


@csrf_exempt  # Called by the relay, which sends no CSRF token.
@require_POST
@idempotent(required=True, mode="atomic", namespace="warehouse-shipments")
def create_shipment(request: HttpRequest) -> HttpResponse:
    """{"order": n}: ship the order, answer 201.

    A relay killed after sending and before marking the message sent sends it again with the
    same key: the stored answer is replayed, and the parcel leaves once.
    """
    try:
        order = int(json.loads(request.body)["order"])
    except (ValueError, KeyError, TypeError):
        return JsonResponse({"detail": "Send a JSON body with order."}, status=400)
    if not 0 < order <= MAX_ORDER:
        return JsonResponse({"detail": f"order must be 1 to {MAX_ORDER}."}, status=400)
    shipment = Shipment.objects.create(key=request.headers["Idempotency-Key"], order=order)
    return JsonResponse({"id": shipment.pk, "order": order}, status=201)
