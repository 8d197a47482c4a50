"""drf-spectacular integration: idempotent operations documented in generated OpenAPI schemas."""

from __future__ import annotations

import importlib.util

from django_idempotency.contrib import missing

# The extension registers itself when imported (the app's ready() does it when drf-spectacular
# is installed); importing the package without it says what to install.
if importlib.util.find_spec("drf_spectacular") is None:
    raise missing(
        ModuleNotFoundError("No module named 'drf_spectacular'", name="drf_spectacular"),
        "spectacular",
    )
