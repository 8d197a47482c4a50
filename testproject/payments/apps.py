"""App configuration for the demo payments app."""

from django.apps import AppConfig


class PaymentsConfig(AppConfig):
    name = "testproject.payments"
    label = "payments"
    default_auto_field = "django.db.models.BigAutoField"
