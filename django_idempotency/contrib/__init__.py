"""Optional integrations, each importing its framework only when used."""

from __future__ import annotations


def missing(exc: ModuleNotFoundError, extra: str) -> ModuleNotFoundError:
    """The import error to raise instead: it says which extra installs what is missing.

    Still a `ModuleNotFoundError` naming the missing module, as code catching it expects.
    """
    return ModuleNotFoundError(
        f'{exc}: install it with pip install "django-idempotency[{extra}]"', name=exc.name
    )
