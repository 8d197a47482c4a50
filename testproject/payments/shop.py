"""The shop's HTML checkout: a Django form, paid once however often a person sends it."""

from __future__ import annotations

import time

from django import forms
from django.conf import settings
from django.contrib import messages
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods

from django_idempotency import idempotent
from django_idempotency.forms import IdempotentFormMixin
from testproject.payments import orders
from testproject.payments.models import Payment


class CheckoutForm(IdempotentFormMixin, forms.ModelForm):  # type: ignore[type-arg]
    """The payment's fields, and the hidden idempotency key the mixin adds."""

    class Meta:
        model = Payment
        fields = ["amount", "currency", "description"]
        widgets = {"currency": forms.Select(choices=[(c, c) for c in ("EUR", "USD", "GBP")])}


@require_http_methods(["GET", "POST"])
@idempotent(required=True, namespace="shop")
def checkout(request: HttpRequest) -> HttpResponse:
    """GET /shop/checkout/: the form. POST: pay, then redirect to the receipt (303); the
    order's e-mail and shipment leave through the outbox (testproject.payments.orders).

    Each form shown carries a key of its own. A double click waits for the first submit and
    gets its redirect; a resubmit (back, then send again) is replayed the same redirect; a form
    with errors is shown again with the same key, which was given back, so that the corrected
    form pays once.
    """
    if request.method == "POST":
        form = CheckoutForm(request.POST)
        if form.is_valid():
            # The payment provider's time: a person clicks again meanwhile.
            time.sleep(settings.SHOP_PAYMENT_SECONDS)
            # One transaction in either mode (in lease mode the guard opens none): the order's
            # e-mail and shipment are written with its payment, or not at all.
            with transaction.atomic():
                payment = form.save()
                orders.follow_up(payment)
            messages.success(request, f"Payment of {payment} received.")
            response = redirect("shop-receipt", payment.pk)
            response.status_code = 303  # See other: the receipt is read with GET.
            return response
    else:
        form = CheckoutForm(initial={"currency": "EUR"})
    return render(request, "payments/shop/checkout.html", {"form": form})


def receipt(request: HttpRequest, pk: int) -> HttpResponse:
    """GET /shop/receipts/<pk>/: the payment, and how many the shop has taken in all."""
    payment = get_object_or_404(Payment, pk=pk)
    context = {"payment": payment, "payments": Payment.objects.count()}
    return render(request, "payments/shop/receipt.html", context)
