"""A DRF viewset guarded by the mixin, and a plain Django view guarded by the decorator."""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.db import connection, transaction
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from rest_framework import mixins, permissions, serializers, viewsets

from django_idempotency import idempotent
from django_idempotency.contrib.rest_framework import IdempotencyMixin
from django_idempotency.models import IdempotencyRecord
from django_idempotency.webhooks import StandardWebhooks
from testproject.payments.models import Payment, Refund
from testproject.payments.payouts import BankUnavailable, pay_out


class PaymentSerializer(serializers.ModelSerializer):
    class Meta:
        model = Payment
        fields = ["id", "amount", "currency", "description", "created_at"]


class PaymentViewSet(
    IdempotencyMixin,
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """POST /api/payments/ runs once per Idempotency-Key."""

    queryset = Payment.objects.order_by("-id")
    serializer_class = PaymentSerializer
    idempotency_required = True
    idempotency_namespace = "payments"


class PlainPaymentViewSet(mixins.CreateModelMixin, viewsets.GenericViewSet):
    """The same create endpoint without idempotency: the benchmark's baseline."""

    queryset = Payment.objects.all()
    serializer_class = PaymentSerializer


FLOOR_BODY = b'{"id":1,"amount":100,"currency":"EUR","description":"benchmark","created_at":null}'


class FloorViewSet(viewsets.GenericViewSet):
    """The benchmark's replay yardstick: the same view stack (middleware, authentication,
    permissions, throttles, negotiation) answering at once with stored bytes, as a replay does,
    but with no lookup at all. No replay that runs after those checks can be faster."""

    def create(self, request: Any) -> HttpResponse:
        return HttpResponse(FLOOR_BODY, status=201, content_type="application/json")


class RecordedPaymentViewSet(PlainPaymentViewSet):
    """The benchmark's fresh-key yardstick: the plain create, plus one record row written in
    the same transaction by a single INSERT. A guard that keeps its promise (the record commits
    with the payment) writes at least that, so no fresh idempotent request can be faster."""

    def perform_create(self, serializer: serializers.BaseSerializer[Payment]) -> None:
        with transaction.atomic():
            serializer.save()
            now = timezone.now()
            columns = (
                "namespace, owner, key, fingerprint, status, method, path, response_status, "
                "response_headers, response_body, lease_token, created_at, completed_at, expires_at"
            )
            quoted = ", ".join(map(connection.ops.quote_name, columns.split(", ")))
            with connection.cursor() as cursor:
                cursor.execute(
                    f"INSERT INTO {IdempotencyRecord._meta.db_table} ({quoted}) "
                    "VALUES (%s, '', %s, %s, 'completed', 'POST', %s, 201, '[]', %s, '', "
                    "%s, %s, %s)",
                    [
                        "bench-record",
                        uuid.uuid4().hex,
                        "0" * 64,
                        self.request.path,
                        json.dumps(serializer.data).encode(),
                        now,
                        now,
                        now + timedelta(days=1),
                    ],
                )


class LeasedPaymentViewSet(PaymentViewSet):
    """The payments endpoint in lease mode, as a view calling an external system would use."""

    idempotency_mode = "lease"
    idempotency_namespace = "payments-lease"


class ProviderPaymentSerializer(PaymentSerializer):
    """A payment the card provider takes `delay` seconds to confirm (a stand-in for its API)."""

    delay = serializers.FloatField(write_only=True, min_value=0, max_value=10, default=0)

    class Meta(PaymentSerializer.Meta):
        fields = [*PaymentSerializer.Meta.fields, "delay"]

    def create(self, validated_data: dict[str, Any]) -> Payment:
        time.sleep(validated_data.pop("delay"))
        return super().create(validated_data)


class ProviderPaymentViewSet(PaymentViewSet):
    """POST /api/provider/payments/ {"amount": n, "delay": s}: a slow view, for watching retries.

    A duplicate sent while the first is still waiting for the provider gets 409 (or waits, with
    IDEMPOTENCY_ON_CONFLICT=wait); a worker killed meanwhile leaves nothing behind, since the
    claim and the payment commit together (atomic mode).
    """

    serializer_class = ProviderPaymentSerializer
    idempotency_namespace = "provider-payments"


class LeasedProviderPaymentViewSet(ProviderPaymentViewSet):
    """The slow payment in lease mode: a killed worker's claim is taken over once its lease ends."""

    idempotency_mode = "lease"
    idempotency_namespace = "provider-payments-lease"


class StaffPaymentViewSet(PaymentViewSet):
    """POST /api/staff/payments/: payments taken by staff on a customer's behalf.

    DRF checks the permission before the key is looked at, so a retry from a user whose staff
    status was revoked meanwhile gets 403, never the stored response.
    """

    permission_classes = [permissions.IsAdminUser]
    idempotency_namespace = "staff-payments"


MAX_AMOUNT = 2**31 - 1  # A PositiveIntegerField's largest value on every database.


@csrf_exempt
@require_POST
@idempotent(required=True, namespace="refunds")
def create_refund(request: HttpRequest) -> HttpResponse:
    """POST /api/refunds/ {"payment": id, "amount": n} runs once per Idempotency-Key."""
    try:
        data = json.loads(request.body)
        payment = get_object_or_404(Payment, pk=int(data["payment"]))
        amount = int(data["amount"])
    except (ValueError, KeyError, TypeError):
        return JsonResponse({"detail": "Send a JSON body with payment and amount."}, status=400)
    if not 0 <= amount <= MAX_AMOUNT:
        # The column's range: beyond it MariaDB refuses the row (a 500), and PostgreSQL and
        # SQLite their check of a positive amount.
        return JsonResponse({"detail": f"amount must be 0 to {MAX_AMOUNT}."}, status=400)
    refund = Refund.objects.create(payment=payment, amount=amount)
    response = JsonResponse({"id": refund.pk, "payment": payment.pk, "amount": amount}, status=201)
    response["Location"] = f"/api/refunds/{refund.pk}/"
    return response


class CheckoutForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = Payment
        fields = ["amount", "currency", "description"]


@csrf_exempt
@require_POST
@idempotent(required=True, namespace="checkout")
def checkout(request: HttpRequest) -> HttpResponse:
    """POST /checkout/ (an HTML form): pay, flash a message, redirect to the payment (303).

    A double-submitted form gets the same redirect to the same payment. The cookie the view sets
    (the currency to preselect next time) is not replayed: a stored response never sets cookies.
    """
    form = CheckoutForm(request.POST)
    if not form.is_valid():
        return JsonResponse({"errors": form.errors}, status=400)
    payment = form.save()
    messages.success(request, f"Payment of {payment} received.")
    response = HttpResponseRedirect(reverse("payment-detail", args=[payment.pk]), status=303)
    response.set_cookie("preferred_currency", payment.currency, samesite="Lax")
    return response


@csrf_exempt
@require_POST
@idempotent(
    header="webhook-id",
    namespace="provider-webhooks",
    required=True,
    verify=StandardWebhooks(lambda: settings.PAYMENTS_WEBHOOK_SECRET),
)
def provider_webhook(request: HttpRequest) -> HttpResponse:
    """POST /webhooks/provider/: the payment provider's signed events, each handled once.

    A redelivered event (same webhook-id) gets the stored 200, so the provider stops retrying;
    a forged or stale one gets 400 before anything is stored.
    """
    event = json.loads(request.body)
    if event.get("type") == "payment.refunded":
        payment = get_object_or_404(Payment, pk=int(event["payment"]))
        Refund.objects.create(payment=payment, amount=int(event["amount"]))
    return JsonResponse({"received": event.get("type")})


@csrf_exempt
@require_POST
@idempotent(required=True, mode="lease", namespace="payouts")
def create_payout(request: HttpRequest) -> HttpResponse:
    """POST /api/payouts/ {"reference": "...", "amount": n}: money sent through the bank, once.

    Lease mode: the bank is another service, so its call cannot join this claim's transaction.
    The claim commits first, and its lease is renewed while the payout runs; a worker killed
    mid-payout leaves it until the lease ends, and the retry that takes it over skips the steps
    done or calls the bank again with the same key, which the bank answers with its first
    answer. `delay` (seconds, at most 10) slows the payout down between its steps.
    """
    try:
        data = json.loads(request.body)
        reference, amount = str(data["reference"]), int(data["amount"])
        currency, delay = str(data.get("currency", "EUR")), float(data.get("delay", 0))
    except (ValueError, KeyError, TypeError):
        return JsonResponse({"detail": "Send a JSON body with reference and amount."}, status=400)
    if (
        not 0 <= amount <= MAX_AMOUNT
        or not 0 < len(reference) <= 200
        or len(currency) != 3
        or not 0 <= delay <= 10
    ):
        return JsonResponse(
            {
                "detail": f"reference: 1 to 200 characters; amount: 0 to {MAX_AMOUNT}; "
                "currency: a 3-letter code; delay: 0 to 10 seconds."
            },
            status=400,
        )
    try:
        payout = pay_out(
            reference, amount, currency, key=request.headers["Idempotency-Key"], delay=delay
        )
    except BankUnavailable as exc:  # A 5xx gives the key back: the client's retry runs again.
        response = JsonResponse({"detail": f"{exc} Retry with the same key."}, status=503)
        response["Retry-After"] = "1"
        return response
    return JsonResponse(payout, status=201)
