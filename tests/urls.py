"""Routes for every view shape the tests exercise."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path
from rest_framework.routers import SimpleRouter

from django_idempotency.contrib.rest_framework.views import KeyStatusAPIView
from django_idempotency.views import KeyStatusView
from tests import views

router = SimpleRouter(trailing_slash=True)
router.register("viewset/charges", views.ChargeViewSet, basename="charges")
router.register("private/charges", views.PrivateChargeViewSet, basename="private-charges")
router.register("throttled/charges", views.ThrottledChargeViewSet, basename="throttled-charges")
router.register("leased/charges", views.LeasedChargeViewSet, basename="leased-charges")
router.register("viewset/uploads", views.UploadViewSet, basename="uploads")

urlpatterns = [
    path("admin/", admin.site.urls),
    path("function/charges/", views.function_view),
    path("idempotency/status/", KeyStatusView.as_view()),
    path("api/idempotency/status/", KeyStatusAPIView.as_view()),
    path("cbv/charges/", views.ClassView.as_view()),
    path("api-view/charges/", views.drf_function_view),
    path("apiview/charges/", views.DrfAPIView.as_view()),
    path("async/charges/", views.async_view),
    path("async-cbv/charges/", views.AsyncClassView.as_view()),
    path("binary/", views.binary_view),
    path("sized/", views.sized_view),
    path("streaming/", views.streaming_view),
    path("webhooks/", views.webhook_view),
    path("unguarded/charges/", views.unguarded_view),
    path("forms/charges/", views.form_view),
    path("answers/", views.answer_view),
    path("uploads/", views.upload_view),
    *router.urls,
]
