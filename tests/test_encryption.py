"""Encryption at rest: what each store and the cache tier hold is not the response; replays are."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.core.cache import caches
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_idempotency import idempotent_function
from django_idempotency.core.outcomes import Scope
from django_idempotency.encryption import UnreadableResponse
from django_idempotency.models import IdempotencyRecord
from django_idempotency.stores import get_store
from django_idempotency.stores.cache import cache_key
from django_idempotency.stores.memory import MemoryStore
from django_idempotency.stores.redis import RedisStore
from tests.factories import UserFactory
from tests.models import Charge
from tests.stores import STORE_PARAMS, _unwrapped, redis_keys, using_store
from tests.utils import assert_problem, clear_own_keys, post, redis_caches

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:63799")
URL = "/viewset/charges/"
# Made for these tests only, with Fernet.generate_key().
OLD_KEY = "5pHGT1e0MXG1VOi1S9f7Yq3yHo9mB1kYp2lIuJ7vW3k="
NEW_KEY = "lq7bH0wqH8j3oYv6VwWJwq1XfB5yW3kq3b0o9sQ2eXU="

pytestmark = pytest.mark.django_db


def held_bytes() -> bytes:
    """Everything the configured store holds of its records, as raw as it keeps it."""
    store = _unwrapped(get_store())
    if isinstance(store, MemoryStore):
        return b"".join(repr(record).encode() for record in store.records.values())
    if isinstance(store, RedisStore):
        redis = store.connection()
        return b"".join(
            name + value for key in redis_keys(store) for name, value in redis.hgetall(key).items()
        )
    with connection.cursor() as cursor:
        cursor.execute("SELECT response_headers, response_body FROM django_idempotency_record")
        return b"".join(
            (str(headers).encode() + bytes(body or b"")) for headers, body in cursor.fetchall()
        )


def secrets_of(response: Any) -> list[bytes]:
    """What of a charge's response must not be readable at rest: its body and its Location."""
    return [response.content, response["Location"].encode()]


@pytest.mark.parametrize("store", STORE_PARAMS)
def test_each_store_holds_ciphertext_and_replays_byte_for_byte(store: str) -> None:
    with using_store(store), override_settings(IDEMPOTENCY_ENCRYPTION_KEYS=[NEW_KEY]):
        client = Client()
        first = post(client, URL)
        held = held_bytes()
        retry = post(client, URL)

    assert first.status_code == 201
    assert held and not any(secret in held for secret in secrets_of(first))
    assert retry.status_code == 201
    assert retry.content == first.content
    assert retry["Location"] == first["Location"]
    assert retry["Content-Type"] == first["Content-Type"]
    assert retry["Idempotent-Replayed"] == "true"
    assert Charge.objects.count() == 1


def test_the_database_row_holds_one_token_and_the_status_in_clear() -> None:
    with override_settings(IDEMPOTENCY_ENCRYPTION_KEYS=[NEW_KEY]):
        first = post(Client(), URL)
    record = IdempotencyRecord.objects.get()

    assert record.response_status == 201  # The admin filters and purges by it.
    assert record.response_headers == [[":encrypted", "fernet"]]
    assert record.response_reason == ""
    opened = Fernet(NEW_KEY).decrypt(bytes(record.response_body))
    assert opened.endswith(first.content)


@pytest.fixture
def redis_tier() -> Iterator[None]:
    with override_settings(
        CACHES=redis_caches(f"{REDIS_URL}/2"),
        IDEMPOTENCY_CACHE="idempotency",
        IDEMPOTENCY_ENCRYPTION_KEYS=[NEW_KEY],
    ):
        clear_own_keys()
        yield
        clear_own_keys()


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("redis_tier")
def test_the_cache_tiers_copy_is_ciphertext_and_replays_with_zero_sql() -> None:
    client = Client()
    first = post(client, URL)
    copy = caches["idempotency"].get(cache_key(Scope("default", "", "key-1")))
    with CaptureQueriesContext(connection) as captured:
        retry = post(client, URL)

    assert isinstance(copy, tuple)
    held = repr(copy).encode()
    assert not any(secret in held for secret in secrets_of(first))
    assert len(captured) == 0  # Served from the cache, decrypted.
    assert (retry.status_code, retry.content) == (201, first.content)
    assert retry["Location"] == first["Location"]


def test_a_retired_key_second_in_the_list_still_replays() -> None:
    client = Client()
    with override_settings(IDEMPOTENCY_ENCRYPTION_KEYS=[OLD_KEY]):
        first = post(client, URL)
    with override_settings(IDEMPOTENCY_ENCRYPTION_KEYS=[NEW_KEY, OLD_KEY]):
        retry = post(client, URL)
        post(client, URL, key="key-2")

    assert (retry.status_code, retry.content) == (201, first.content)
    newest = IdempotencyRecord.objects.get(key="key-2")
    Fernet(NEW_KEY).decrypt(bytes(newest.response_body))  # New records: the first key.


@pytest.mark.parametrize("keys", [[NEW_KEY], None], ids=["key-removed", "encryption-off"])
def test_a_response_no_configured_key_opens_is_a_problem_not_a_second_run(
    keys: list[str] | None, caplog: pytest.LogCaptureFixture
) -> None:
    client = Client()
    with override_settings(IDEMPOTENCY_ENCRYPTION_KEYS=[OLD_KEY]):
        post(client, URL)
    with override_settings(IDEMPOTENCY_ENCRYPTION_KEYS=keys):
        retry = post(client, URL)

    problem = assert_problem(retry, 410, "response-not-decryptable")
    assert "completed with status 201" in problem["detail"]
    assert "Retry-After" not in retry
    assert Charge.objects.count() == 1
    assert "IDEMPOTENCY_ENCRYPTION_KEYS" in caplog.text


def test_a_record_stored_before_encryption_was_enabled_still_replays() -> None:
    client = Client()
    first = post(client, URL)
    with override_settings(IDEMPOTENCY_ENCRYPTION_KEYS=[NEW_KEY]):
        retry = post(client, URL)

    assert (retry.status_code, retry.content) == (201, first.content)
    assert retry["Location"] == first["Location"]


def test_a_functions_stored_result_is_encrypted_too() -> None:
    calls: list[str] = []

    @idempotent_function(key=lambda card: card, namespace="cards")
    def issue(card: str) -> dict[str, str]:
        calls.append(card)
        return {"pan": "4111111111111111"}

    with override_settings(IDEMPOTENCY_ENCRYPTION_KEYS=[NEW_KEY]):
        first, again = issue("card-1"), issue("card-1")
    held = bytes(IdempotencyRecord.objects.get().response_body)
    with (
        override_settings(IDEMPOTENCY_ENCRYPTION_KEYS=[OLD_KEY]),
        pytest.raises(UnreadableResponse, match="no longer in IDEMPOTENCY_ENCRYPTION_KEYS"),
    ):
        issue("card-1")

    assert first == again == {"pan": "4111111111111111"}
    assert calls == ["card-1"]
    assert b"4111111111111111" not in held


# The admin


def staff(*codenames: str) -> Client:
    from django.contrib.auth.models import Permission

    user = UserFactory(is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="django_idempotency", codename__in=codenames
        )
    )
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def encrypted_record() -> Iterator[IdempotencyRecord]:
    with override_settings(IDEMPOTENCY_ENCRYPTION_KEYS=[NEW_KEY]):
        post(Client(), URL, {"amount": 4242})
        yield IdempotencyRecord.objects.get()


def detail(client: Client, record: IdempotencyRecord) -> str:
    url = reverse("admin:django_idempotency_idempotencyrecord_change", args=[record.pk])
    response = client.get(url)
    assert response.status_code == 200
    return response.content.decode()


def test_the_admin_says_a_body_is_encrypted_and_shows_it_only_with_the_permission(
    encrypted_record: IdempotencyRecord,
) -> None:
    viewer = detail(staff("view_idempotencyrecord"), encrypted_record)
    reader = detail(staff("view_idempotencyrecord", "view_decrypted_response"), encrypted_record)

    assert "Encrypted at rest. Reading it needs the permission" in viewer
    # The body's field, not its number: 4242 may turn up inside a random token on the page.
    assert "amount" not in viewer
    assert "Location" not in viewer  # Nor the headers.
    assert "Encrypted at rest; decrypted for you." in reader
    assert "amount&quot;: 4242" in reader  # The body, pretty-printed.
    assert "Location" in reader


def test_the_admin_says_when_no_configured_key_opens_a_body(
    encrypted_record: IdempotencyRecord,
) -> None:
    with override_settings(IDEMPOTENCY_ENCRYPTION_KEYS=[OLD_KEY]):
        page = detail(staff("view_idempotencyrecord", "view_decrypted_response"), encrypted_record)

    assert "with a key no longer in IDEMPOTENCY_ENCRYPTION_KEYS" in page
    assert "amount" not in page


def test_the_admin_shows_a_plaintext_body_as_before(admin_client: Client) -> None:
    post(Client(), URL, {"amount": 4242})
    page = detail(admin_client, IdempotencyRecord.objects.get())

    assert "amount&quot;: 4242" in page
    assert "Encrypted at rest" not in page


def test_the_permission_is_declared_on_the_model() -> None:
    assert ("view_decrypted_response", "Can view decrypted stored responses") in [
        (codename, str(name)) for codename, name in IdempotencyRecord._meta.permissions
    ]
