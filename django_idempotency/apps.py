"""Django app configuration for django_idempotency."""

from __future__ import annotations

import importlib.util

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class IdempotencyConfig(AppConfig):
    name = "django_idempotency"
    verbose_name = _("Idempotency")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registered here, not at import, so importing the package has no side effects.
        from django.core import checks
        from django.core.signals import setting_changed

        from django_idempotency import checks as idempotency_checks
        from django_idempotency.conf import reload_on_change

        setting_changed.connect(reload_on_change, dispatch_uid="django_idempotency.conf")

        checks.register(idempotency_checks.check_settings, idempotency_checks.TAG)
        checks.register(idempotency_checks.check_deployment, idempotency_checks.TAG, deploy=True)
        checks.register(idempotency_checks.check_views, idempotency_checks.TAG, checks.Tags.urls)
        # Run by `check --database <alias>` (and `migrate`): it queries the database.
        checks.register(
            idempotency_checks.check_database, idempotency_checks.TAG, checks.Tags.database
        )
        # runserver's start looks for unapplied migrations on `default` only: the records'
        # database too, when they live elsewhere.
        from django_idempotency.checks import startup

        startup.install()

        # A test's server or worker started with IDEMPOTENCY_CRASH_AT crashes where it says.
        from django_idempotency import crashes

        crashes.arm_from_environment()

        if importlib.util.find_spec("rest_framework") is not None:
            # IDEMPOTENCY_GUARD_ALL_VIEWS: read on each request, so installed whatever its value.
            from django_idempotency.contrib.rest_framework import project

            project.install()

        if importlib.util.find_spec("drf_spectacular") is not None:
            # Imported only when drf-spectacular is there: the import registers the extension.
            import django_idempotency.contrib.drf_spectacular.extensions  # noqa: F401

        if importlib.util.find_spec("prometheus_client") is not None:
            # Imported only when prometheus_client is there; nothing is registered before use.
            from django_idempotency.contrib import prometheus

            prometheus.install()

        if importlib.util.find_spec("opentelemetry") is not None:
            # Imported only when opentelemetry-api is there; spans need a configured SDK.
            from django_idempotency.contrib import opentelemetry

            opentelemetry.install()
