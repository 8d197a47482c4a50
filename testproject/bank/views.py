"""POST /bank/transfers/: a bank's transfer endpoint, executed once per Idempotency-Key."""

from __future__ import annotations

import json

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from django_idempotency import idempotent
from testproject.bank.models import Transfer

MAX_AMOUNT = 2**31 - 1  # A PositiveIntegerField's largest value on every database.


@csrf_exempt
@require_POST
@idempotent(required=True, mode="atomic", namespace="bank-transfers")
def create_transfer(request: HttpRequest) -> HttpResponse:
    """{"reference": "...", "amount": n, "currency": "EUR"}: move the money, answer 201.

    Atomic mode: the transfer and the stored answer commit together, so a caller that retries
    with the same key after losing the answer gets it replayed, and the money moved once.
    """
    try:
        data = json.loads(request.body)
        reference, amount = str(data["reference"]), int(data["amount"])
        currency = str(data.get("currency", "EUR"))
    except (ValueError, KeyError, TypeError):
        return JsonResponse(
            {"detail": "Send a JSON body with reference, amount and currency."}, status=400
        )
    if not 0 <= amount <= MAX_AMOUNT or not 0 < len(reference) <= 200 or len(currency) != 3:
        return JsonResponse(
            {
                "detail": f"reference: 1 to 200 characters; amount: 0 to {MAX_AMOUNT}; "
                "currency: a 3-letter code."
            },
            status=400,
        )
    transfer = Transfer.objects.create(
        key=request.headers["Idempotency-Key"],
        reference=reference,
        amount=amount,
        currency=currency,
    )
    body = {"id": transfer.pk, "reference": reference, "amount": amount, "currency": currency}
    return JsonResponse(body, status=201)
