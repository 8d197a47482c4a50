"""A DRF viewset guarded by the mixin, and a plain Django view guarded by the decorator."""

from __future__ import annotations

import json

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from rest_framework import mixins, serializers, viewsets

from django_idempotency import idempotent
from django_idempotency.contrib.rest_framework import IdempotencyMixin
from django_idempotency.webhooks import StandardWebhooks
from testproject.payments.models import Payment, Refund


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


class LeasedPaymentViewSet(PaymentViewSet):
    """The payments endpoint in lease mode, as a view calling an external system would use."""

    idempotency_mode = "lease"
    idempotency_namespace = "payments-lease"


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
    refund = Refund.objects.create(payment=payment, amount=amount)
    response = JsonResponse({"id": refund.pk, "payment": payment.pk, "amount": amount}, status=201)
    response["Location"] = f"/api/refunds/{refund.pk}/"
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
