"""pytest plugin, loaded through the `pytest11` entry point: the `assert_idempotent` fixture.

pytest loads plugins before Django is set up, so nothing from Django is imported at the top.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from django.test import Client


@pytest.fixture
def assert_idempotent(client: Client) -> Any:
    """`django_idempotency.testing.assert_idempotent` bound to pytest-django's ``client``.

    ``assert_idempotent("POST", "/charges/", {"amount": 1})`` returns both responses.
    """
    from django_idempotency.testing import assert_idempotent as check

    return functools.partial(check, client)
