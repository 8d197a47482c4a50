"""Demo routes: the payments API (DRF and Django Ninja), its OpenAPI schema, the admin, the
downstream bank the payouts call, and the warehouse the shop's orders ship from."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from testproject.payments import shop, views, warehouse
from testproject.payments.ninja_api import api as ninja_api

router = DefaultRouter()
router.register("payments", views.PaymentViewSet, basename="payment")
# Variants the benchmark compares (benchmarks/README.md).
router.register("bench/plain", views.PlainPaymentViewSet, basename="bench-plain")
router.register("bench/lease", views.LeasedPaymentViewSet, basename="bench-lease")
router.register("bench/floor", views.FloorViewSet, basename="bench-floor")
router.register("bench/recorded", views.RecordedPaymentViewSet, basename="bench-recorded")
# A slow payment, a staff-only one (tests/reliability serves the demo to test retries under fire).
router.register("provider/payments", views.ProviderPaymentViewSet, basename="provider-payment")
router.register("provider/lease", views.LeasedProviderPaymentViewSet, basename="provider-lease")
router.register("staff/payments", views.StaffPaymentViewSet, basename="staff-payment")

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/refunds/", views.create_refund, name="refund-create"),
    path("api/payouts/", views.create_payout, name="payout-create"),
    path("checkout/", views.checkout, name="checkout"),
    # The shop's HTML checkout, a Django form (docs/forms.md).
    path("shop/checkout/", shop.checkout, name="shop-checkout"),
    path("shop/receipts/<int:pk>/", shop.receipt, name="shop-receipt"),
    path("webhooks/provider/", views.provider_webhook, name="provider-webhook"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("api/", include(router.urls)),
    # The same payments in Django Ninja (docs/ninja.md).
    path("ninja/", ninja_api.urls),
    # The downstream bank the payouts call, served by another instance of the demo.
    path("bank/", include("testproject.bank.urls")),
    # The warehouse the shop's orders are shipped from, through the outbox.
    path("warehouse/shipments/", warehouse.create_shipment, name="warehouse-shipment-create"),
]
