"""A DRF viewset guarded by the mixin, and a plain Django view guarded by the decorator."""

from __future__ import annotations

import json
import time
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from rest_framework import mixins, permissions, serializers, viewsets

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
