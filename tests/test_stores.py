"""The configured store: refused if it is not one; a store whose backend is lost says so."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, override_settings

from django_idempotency.models import IdempotencyRecord
from django_idempotency.stores import StoreUnavailable, _store_for
from django_idempotency.stores.database import DatabaseStore
from tests.models import Charge
from tests.stores import claim_request
from tests.utils import post

pytestmark = pytest.mark.django_db


class NotAStore:
    """Importable and constructible, but none of the store contract."""


@pytest.fixture
def not_a_store() -> Iterator[None]:
    with override_settings(IDEMPOTENCY_STORE="tests.test_stores.NotAStore"):
        _store_for.cache_clear()
        try:
            yield
        finally:
            _store_for.cache_clear()


@pytest.mark.usefixtures("not_a_store")
def test_a_store_setting_that_names_no_store_fails_the_request_before_the_view_runs() -> None:
    # `manage.py check` reports it as E009; a project that ran without checks finds out here.
    with pytest.raises(ImproperlyConfigured) as error:
        post(Client(), "/function/charges/")

    assert str(error.value) == (
        "IDEMPOTENCY_STORE = 'tests.test_stores.NotAStore' is not a BaseStore."
    )
    assert Charge.objects.count() == 0
    assert IdempotencyRecord.objects.count() == 0


@pytest.mark.usefixtures("database_down")
def test_the_database_store_answers_a_lost_database_with_store_unavailable() -> None:
    # The contract every store keeps: a backend that cannot be reached is said so, never taken
    # for a key nobody holds.
    store = DatabaseStore()

    with pytest.raises(StoreUnavailable):
        store.lookup(claim_request())
    with pytest.raises(StoreUnavailable):
        store.begin(claim_request())
