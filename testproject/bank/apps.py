"""App configuration for the demo bank."""

from django.apps import AppConfig


class BankConfig(AppConfig):
    name = "testproject.bank"
    label = "bank"
    default_auto_field = "django.db.models.BigAutoField"
