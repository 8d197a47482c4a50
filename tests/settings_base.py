"""Test settings without Django REST framework, for the `base` tox env (Django alone)."""

from __future__ import annotations

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [app for app in INSTALLED_APPS if not app.startswith("rest_framework")]
# tests.urls routes DRF views; this module routes the admin and plain Django views only.
ROOT_URLCONF = "tests.test_optional_dependencies"
