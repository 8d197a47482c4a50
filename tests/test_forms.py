"""Forms on every method. Multipart uploads: the same upload replays, another one is 422, the view
reads every byte, whether the body fits in DATA_UPLOAD_MAX_MEMORY_SIZE or is parsed from the
stream. Urlencoded fields: compared as text, in the charset the request names."""

from __future__ import annotations

import hashlib
import json
from typing import Any
from urllib.parse import urlencode

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.middleware.csrf import _mask_cipher_secret
from django.test import Client, override_settings
from django.test.client import encode_multipart

from tests.models import Charge
from tests.utils import CSRF_TOKEN, assert_problem, logged_in_browser

pytestmark = pytest.mark.django_db

URL = "/uploads/"
RECEIPT = bytes(range(256)) * 4  # 1 KiB: over the limit the large-body tests set.


def upload(
    client: Client,
    method: str,
    fields: dict[str, Any],
    *,
    boundary: str = "first-boundary",
    key: str = "upload-1",
    **headers: str,
) -> Any:
    body = encode_multipart(boundary, fields)
    return client.generic(
        method,
        URL,
        body,
        content_type=f"multipart/form-data; boundary={boundary}",
        headers={"Idempotency-Key": key, **headers},
    )


def receipt(content: bytes = RECEIPT, name: str = "receipt.bin") -> SimpleUploadedFile:
    return SimpleUploadedFile(name, content)


@pytest.fixture(params=["in memory", "from the stream"])
def body_size_limit(request: pytest.FixtureRequest) -> Any:
    """Bodies that fit in DATA_UPLOAD_MAX_MEMORY_SIZE, and bodies over it (parsed from the stream
    instead of kept: Django counts only the fields against the limit, so the upload is allowed)."""
    limit = 2_621_440 if request.param == "in memory" else 200
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=limit):
        yield request.param


@pytest.mark.usefixtures("body_size_limit")
@pytest.mark.parametrize("method", ["POST", "PATCH"])
def test_the_same_upload_replays_and_another_file_name_or_content_is_422(method: str) -> None:
    client = Client()
    first = upload(client, method, {"note": "a", "receipt": receipt()})
    again = upload(client, method, {"note": "a", "receipt": receipt()}, boundary="other-boundary")
    renamed = upload(client, method, {"note": "a", "receipt": receipt(name="other.bin")})
    changed = upload(client, method, {"note": "a", "receipt": receipt(RECEIPT[::-1])})
    other_field = upload(client, method, {"note": "b", "receipt": receipt()})

    assert first.status_code == 201, first.content
    assert again["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    for other in (renamed, changed, other_field):
        assert_problem(other, 422, "key-reused")
    assert Charge.objects.count() == 1


def test_a_post_view_reads_every_byte_of_an_upload_after_its_fingerprint(
    body_size_limit: str,
) -> None:
    first = upload(Client(), "POST", {"note": "a", "receipt": receipt()})

    answer = json.loads(first.content)
    expected = [["receipt.bin", hashlib.sha256(RECEIPT).hexdigest()]]
    assert answer["uploads"] == {"receipt": expected}
    assert answer["fields"] == {"note": ["a"]}


def test_a_patch_over_the_limit_is_parsed_once_and_its_view_gets_the_upload() -> None:
    # Django parses a form only for a POST; a PATCH too large to keep is parsed from its stream
    # for the fingerprint, and the view finds the result where Django keeps a POST's.
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=200):
        first = upload(Client(), "PATCH", {"note": "a", "receipt": receipt()})

    answer = json.loads(first.content)
    assert answer["uploads"] == {"receipt": [["receipt.bin", hashlib.sha256(RECEIPT).hexdigest()]]}
    assert answer["fields"] == {"note": ["a"]}


@override_settings(IDEMPOTENCY_FINGERPRINT_IGNORE_FIELDS=["nonce"])
@pytest.mark.usefixtures("body_size_limit")
@pytest.mark.parametrize("method", ["POST", "PATCH"])
def test_an_ignored_field_of_an_upload_may_change(method: str) -> None:
    client = Client()
    first = upload(client, method, {"nonce": "1", "receipt": receipt()})
    again = upload(client, method, {"nonce": "2", "receipt": receipt()})

    assert first.status_code == 201
    assert again["Idempotent-Replayed"] == "true"


@pytest.mark.parametrize("method", ["POST", "PATCH"])
def test_a_body_of_exactly_the_limit_stays_readable_for_the_view(method: str) -> None:
    body = encode_multipart("first-boundary", {"note": "a"})
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=len(body)):
        first = upload(Client(), method, {"note": "a"}, **{"X-Read-Body": "1"})

    assert first.status_code == 201, first.content
    assert json.loads(first.content)["body"] == len(body)


def send_urlencoded(client: Client, method: str, body: bytes, charset: str = "utf-8") -> Any:
    return client.generic(
        method,
        URL,
        body,
        content_type=f"application/x-www-form-urlencoded; charset={charset}",
        headers={"Idempotency-Key": "form-1"},
    )


def test_a_urlencoded_post_not_in_utf_8_is_a_problem_not_an_html_page() -> None:
    # Django refuses to parse it (urlencoded forms are UTF-8); the client learns why.
    response = send_urlencoded(Client(), "POST", b"name=Ren%E9", charset="iso-8859-1")

    problem = assert_problem(response, 400, "malformed-request")
    assert "UTF-8" in problem["detail"]
    assert not Charge.objects.exists()


def test_the_same_patched_field_in_another_charset_is_the_same_request() -> None:
    # Django parses no PATCH: its fields are read in the charset the request names, as a
    # framework's form parser reads them.
    method = "PATCH"
    client = Client()
    first = send_urlencoded(client, method, b"name=Ren%E9", charset="iso-8859-1")
    again = send_urlencoded(client, method, b"name=Ren%C3%A9", charset="utf-8")
    other = send_urlencoded(client, method, b"name=Rene", charset="utf-8")

    assert first.status_code == 201, first.content
    assert again["Idempotent-Replayed"] == "true"
    assert_problem(other, 422, "key-reused")


@override_settings(IDEMPOTENCY_FINGERPRINT_IGNORE_FIELDS=["nonce"])
@pytest.mark.parametrize("method", ["POST", "PATCH"])
def test_an_ignored_urlencoded_field_may_change(method: str) -> None:
    client = Client()
    first = send_urlencoded(client, method, b"amount=1&nonce=1")
    again = send_urlencoded(client, method, b"amount=1&nonce=2")
    other = send_urlencoded(client, method, b"amount=2&nonce=1")

    assert first.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert_problem(other, 422, "key-reused")


# Behind DRF, whose session authentication checks CSRF by reading the form first


@pytest.fixture
def drf_session() -> Client:
    """A logged-in browser holding its CSRF token: DRF checks it, reading the form."""
    return logged_in_browser()


def drf_upload(client: Client, fields: dict[str, Any], **headers: str) -> Any:
    body = encode_multipart("first-boundary", {**fields, "csrfmiddlewaretoken": CSRF_TOKEN})
    return client.post(
        "/viewset/uploads/",
        body,
        content_type="multipart/form-data; boundary=first-boundary",
        headers={"Idempotency-Key": "upload-1", "X-CSRFToken": CSRF_TOKEN, **headers},
    )


def test_behind_drfs_csrf_check_the_view_can_still_read_the_body(drf_session: Client) -> None:
    # The mixin keeps a body that fits in memory before DRF's CSRF check parses the form from
    # the stream, so the view may read request.body as well as the form.
    first = drf_upload(drf_session, {"note": "a", "receipt": receipt()}, **{"X-Read-Body": "1"})

    assert first.status_code == 201, first.content
    answer = json.loads(first.content)
    assert answer["uploads"] == {"receipt": [["receipt.bin", hashlib.sha256(RECEIPT).hexdigest()]]}
    assert answer["body"] > len(RECEIPT)


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=200)
def test_behind_drfs_csrf_check_an_upload_over_the_limit_runs_once_and_replays(
    drf_session: Client,
) -> None:
    # Too large to keep, the body is left to the stream: Django holds only the fields to the
    # limit, so the upload is allowed, and its fingerprint is taken from the parsed form.
    first = drf_upload(drf_session, {"note": "a", "receipt": receipt()})
    again = drf_upload(drf_session, {"note": "a", "receipt": receipt()})
    other = drf_upload(drf_session, {"note": "a", "receipt": receipt(b"another receipt")})

    assert first.status_code == 201, first.content
    assert again["Idempotent-Replayed"] == "true"
    assert_problem(other, 422, "key-reused")
    assert Charge.objects.count() == 1


def reads_the_form(get_response: Any) -> Any:
    """A middleware that reads a POST's form, as a logging or tenant middleware may."""

    def middleware(request: Any) -> Any:
        request.POST  # noqa: B018 - reading it is the point.
        return get_response(request)

    return middleware


def test_behind_drf_a_form_a_middleware_parsed_first_still_runs_once(
    settings: Any, drf_session: Client
) -> None:
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "tests.test_forms.reads_the_form"]

    first = drf_upload(drf_session, {"note": "a", "receipt": receipt()})
    again = drf_upload(drf_session, {"note": "a", "receipt": receipt()})

    assert first.status_code == 201, first.content
    assert again["Idempotent-Replayed"] == "true"
    assert Charge.objects.count() == 1


@pytest.mark.parametrize("method", ["POST", "PATCH"])
def test_a_content_length_that_is_not_a_number_is_read_as_django_reads_it(method: str) -> None:
    # WSGI servers refuse such a request; one passed on anyway gets what Django reads of it (no
    # body at all), never a 500.
    body = encode_multipart("first-boundary", {"note": "a"})
    first = Client().generic(
        method,
        URL,
        body,
        content_type="multipart/form-data; boundary=first-boundary",
        headers={"Idempotency-Key": "length-1"},
        CONTENT_LENGTH="nonsense",
    )

    assert first.status_code == 201, first.content
    assert json.loads(first.content)["fields"] == {}


# The CSRF token is not part of the request: a form re-rendered after a validation error carries
# a new one, and its retry with the same key and fields is the same request.


@pytest.mark.parametrize("encoding", ["urlencoded", "multipart"])
def test_a_form_posted_again_with_a_new_csrf_token_replays(client: Client, encoding: str) -> None:
    def post(token: str, note: str = "a") -> Any:
        fields = {"note": note, "csrfmiddlewaretoken": token}
        if encoding == "urlencoded":
            return client.post(
                URL,
                urlencode(fields),
                content_type="application/x-www-form-urlencoded",
                headers={"Idempotency-Key": "form-1"},
            )
        return client.post(URL, fields, headers={"Idempotency-Key": "form-1"})

    first = post("first-token")
    again = post("second-token")
    other = post("third-token", note="b")

    assert first.status_code == 201, first.content
    assert again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert_problem(other, 422, "key-reused")


def test_behind_drfs_csrf_check_a_new_masked_token_and_header_replay(drf_session: Client) -> None:
    # Each render of a form masks the session's secret anew: the field and the X-CSRFToken
    # header differ on the retry, and CSRF accepts both.
    def post(token: str) -> Any:
        body = encode_multipart("b", {"note": "a", "csrfmiddlewaretoken": token})
        return drf_session.post(
            "/viewset/uploads/",
            body,
            content_type="multipart/form-data; boundary=b",
            headers={"Idempotency-Key": "form-2", "X-CSRFToken": token},
        )

    first = post(_mask_cipher_secret(CSRF_TOKEN))
    again = post(_mask_cipher_secret(CSRF_TOKEN))

    assert first.status_code == 201, first.content
    assert again["Idempotent-Replayed"] == "true"
    assert Charge.objects.count() == 1
