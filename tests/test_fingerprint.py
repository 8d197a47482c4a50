"""Request fingerprints: equal requests hash equal, whatever their incidental encoding."""

from __future__ import annotations

import hashlib
import json
import random
import re
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.http import HttpRequest
from django.test import Client, override_settings
from django.test.client import encode_multipart
from hypothesis import given
from hypothesis import strategies as st

from django_idempotency.core.fingerprint import (
    UnreadableBody,
    canonical_body,
    canonical_json,
    canonical_multipart,
    fingerprint,
    is_json_media_type,
)
from tests.models import Charge
from tests.utils import assert_problem

URL = "/function/charges/"
DRF_URL = "/api-view/charges/"
FORM = "application/x-www-form-urlencoded"

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=25,
)
STRING_LITERAL = re.compile(r'"(?:[^"\\]|\\.)*"')


def constant_fingerprint(request: HttpRequest) -> str:
    """An IDEMPOTENCY_FINGERPRINT that calls every request the same."""
    return "0" * 64


def reorder(value: Any, rnd: random.Random) -> Any:
    """The same JSON value with every object's keys inserted in a shuffled order."""
    if isinstance(value, dict):
        names = list(value)
        rnd.shuffle(names)
        return {name: reorder(value[name], rnd) for name in names}
    if isinstance(value, list):
        return [reorder(item, rnd) for item in value]
    return value


def reverse_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {name: reverse_keys(value[name]) for name in reversed(list(value))}
    if isinstance(value, list):
        return [reverse_keys(item) for item in value]
    return value


# canonical_json


@given(JSON_VALUES, st.randoms(use_true_random=False))
def test_object_key_order_does_not_change_canonical_json(value: Any, rnd: random.Random) -> None:
    assert canonical_json(reorder(value, rnd)) == canonical_json(value)
    assert canonical_json(reverse_keys(value)) == canonical_json(value)


def as_doubles(value: Any) -> Any:
    """The value as RFC 8785 reads numbers: doubles, but integers beyond 2^53 kept exact."""
    if isinstance(value, dict):
        return {name: as_doubles(item) for name, item in value.items()}
    if isinstance(value, list):
        return [as_doubles(item) for item in value]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**53:
        return float(value)
    return value


def parse_as_doubles(text: bytes) -> Any:
    return json.loads(text, parse_int=lambda digits: as_doubles(int(digits)))


# Floats below 2^53: above it, RFC 8785 writes a double as digits an exact integer may share.
EXACT_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, min_value=-(2.0**53), max_value=2.0**53)
    | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=25,
)


@given(EXACT_JSON_VALUES)
def test_canonical_json_decodes_to_the_same_value(value: Any) -> None:
    assert parse_as_doubles(canonical_json(value)) == as_doubles(value)


# Keys within the Basic Multilingual Plane: beyond it, RFC 8785's UTF-16 order differs from
# Python's code point order (the UTF-16 test covers those).
BMP_KEYS = st.text(st.characters(max_codepoint=0xFFFF, exclude_categories=("Cs",)))


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda children: st.lists(children) | st.dictionaries(BMP_KEYS, children),
        max_leaves=25,
    )
)
def test_canonical_json_without_floats_is_sorted_and_has_no_whitespace(value: Any) -> None:
    # Without floats, and with keys in the Basic Multilingual Plane, RFC 8785 is Python's
    # sorted, compact JSON.
    canonical = canonical_json(value)

    assert canonical == json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode("utf-8")
    assert not re.search(r"\s", STRING_LITERAL.sub("", canonical.decode("utf-8")))


@given(st.lists(JSON_VALUES, min_size=2, max_size=4))
def test_arrays_keep_their_order(items: list[Any]) -> None:
    encoded = [canonical_json(item) for item in items]
    if encoded == encoded[::-1]:
        return  # A palindrome: reversing it changes nothing.

    assert canonical_json(items) != canonical_json(items[::-1])


def test_canonical_json_sorts_nested_keys() -> None:
    value = {"b": {"y": 1, "x": [{"d": 2, "c": 3}]}, "a": None}

    assert canonical_json(value) == b'{"a":null,"b":{"x":[{"c":3,"d":2}],"y":1}}'


@pytest.mark.parametrize(
    ("one", "other"),
    [("1", "1.0"), ("1", "1e0"), ("100", "1E2"), ("-0", "0"), ("0.5", "5e-1"), ("1e21", "1E+21")],
)
def test_json_numbers_of_one_value_are_the_same_body(one: str, other: str) -> None:
    body = '{"amount": %s}'
    assert canonical_body("application/json", (body % one).encode()) == canonical_body(
        "application/json", (body % other).encode()
    )


def test_json_numbers_take_their_rfc8785_form() -> None:
    value = json.loads("[1.0, 1e-7, 1e21, 1e20, 0.1, -2.50, 5e-324]")

    assert canonical_json(value) == b"[1,1e-7,1e+21,100000000000000000000,0.1,-2.5,5e-324]"


def test_integers_beyond_double_precision_stay_distinct() -> None:
    first = b'{"account": 123456789012345678901234}'
    second = b'{"account": 123456789012345678901235}'

    assert canonical_body("application/json", first) != canonical_body("application/json", second)
    assert canonical_body("application/json", first) == b'{"account":123456789012345678901234}'


def test_keys_sort_by_utf16_code_units() -> None:
    # U+1F600 is a surrogate pair in UTF-16 (0xD83D…), so it sorts before U+FF21 (0xFF21).
    value = {"\uff21": 1, "\U0001f600": 2.5}

    assert canonical_json(value) == '{"\U0001f600":2.5,"\uff21":1}'.encode()


def test_json_nested_too_deeply_is_unreadable() -> None:
    with pytest.raises(UnreadableBody):
        canonical_body("application/json", b"[" * 100_000 + b"]" * 100_000)


def test_value_nested_too_deeply_to_write_is_unreadable_and_says_why() -> None:
    # A body the parser just managed to read can still be too deep to write back; the message
    # is the 400 problem's detail.
    value: list[Any] = []
    for _ in range(100_000):
        value = [value]

    with pytest.raises(UnreadableBody) as raised:
        canonical_json(value)

    assert str(raised.value) == "The JSON body is nested too deeply to compare."


def test_canonical_json_keeps_non_ascii_text_as_utf8() -> None:
    assert canonical_json({"name": "café"}) == '{"name":"café"}'.encode()


# canonical_body: JSON


@pytest.mark.parametrize(
    "media_type",
    ["application/json", "application/merge-patch+json", "application/vnd.api+json"],
)
def test_json_bodies_are_canonicalised(media_type: str) -> None:
    body = b'{ "b" : [1, 2],\n  "a": {"y": true, "x": null} }'

    assert canonical_body(media_type, body) == b'{"a":{"x":null,"y":true},"b":[1,2]}'


@pytest.mark.parametrize(
    ("media_type", "is_json"),
    [
        ("application/json", True),
        ("application/problem+json", True),
        ("application/merge-patch+json", True),
        ("text/plain", False),
        ("application/x-www-form-urlencoded", False),
        ("application/jsonl", False),
        ("", False),
    ],
)
def test_json_media_types_are_recognised(media_type: str, is_json: bool) -> None:
    assert is_json_media_type(media_type) is is_json


def test_reordered_json_keys_are_the_same_body() -> None:
    first = canonical_body("application/json", b'{"amount": 10, "currency": "EUR"}')
    second = canonical_body("application/json", b'{"currency":"EUR","amount":10}')

    assert first == second


def test_different_json_values_are_different_bodies() -> None:
    first = canonical_body("application/json", b'{"amount": 10}')
    second = canonical_body("application/json", b'{"amount": 11}')

    assert first != second


@pytest.mark.parametrize("body", [b"{not json", b'{"a": 1', b"\xff\xfe\x00garbage", b""])
def test_invalid_json_falls_back_to_the_raw_bytes(body: bytes) -> None:
    assert canonical_body("application/json", body) == body


def test_lone_surrogate_escapes_in_json_still_give_a_canonical_body() -> None:
    # Valid JSON (RFC 8259 allows any \uXXXX escape) that no UTF-8 encoder accepts as text.
    first = canonical_body("application/json", b'{"note": "\\ud800"}')
    second = canonical_body("application/json", b'{"note": "\\udc00"}')

    assert isinstance(first, bytes)
    assert first != second


def test_lone_surrogate_escapes_in_keys_beside_a_float_still_give_a_canonical_body() -> None:
    # A float takes the RFC 8785 path, which orders the keys by their UTF-16 code units.
    first = canonical_body("application/json", b'{"\\ud800": 1.5, "a": 1}')
    second = canonical_body("application/json", b'{"a": 1, "\\ud800": 1.5}')

    assert first == second == '{"a":1,"\ud800":1.5}'.encode("utf-8", "surrogatepass")


def test_ignored_fields_are_dropped_from_json_objects() -> None:
    first = canonical_body("application/json", b'{"amount": 10, "nonce": "a"}', {"nonce"})
    second = canonical_body("application/json", b'{"nonce": "b", "amount": 10}', {"nonce"})

    assert first == second == b'{"amount":10}'


def test_ignored_fields_are_only_dropped_at_the_top_level() -> None:
    first = canonical_body("application/json", b'{"meta": {"nonce": "a"}}', {"nonce"})
    second = canonical_body("application/json", b'{"meta": {"nonce": "b"}}', {"nonce"})

    assert first != second


def test_ignored_fields_leave_json_arrays_alone() -> None:
    assert canonical_body("application/json", b'["nonce", 1]', {"nonce"}) == b'["nonce",1]'


# canonical_body: forms and everything else


def test_reordered_form_fields_are_the_same_body() -> None:
    assert canonical_body(FORM, b"b=2&a=1&a=0") == canonical_body(FORM, b"a=1&b=2&a=0")


def test_the_order_of_a_repeated_fields_values_counts() -> None:
    # Django's request.POST["to"] is the last value: mallory in one, alice in the other.
    assert canonical_body(FORM, b"to=alice&to=mallory") != canonical_body(
        FORM, b"to=mallory&to=alice"
    )


def test_different_form_values_are_different_bodies() -> None:
    assert canonical_body(FORM, b"a=1&b=2") != canonical_body(FORM, b"a=1&b=3")


def test_blank_form_values_are_kept() -> None:
    assert canonical_body(FORM, b"a=1&b=") != canonical_body(FORM, b"a=1")


def test_form_encoding_of_spaces_does_not_matter() -> None:
    assert canonical_body(FORM, b"note=a+b") == canonical_body(FORM, b"note=a%20b")


def test_ignored_fields_are_dropped_from_forms() -> None:
    first = canonical_body(FORM, b"amount=10&nonce=a", {"nonce"})
    second = canonical_body(FORM, b"nonce=b&amount=10", {"nonce"})

    assert first == second == canonical_body(FORM, b"amount=10")


def test_a_form_that_is_not_utf8_is_compared_as_raw_bytes() -> None:
    # Latin-1 from an old client: no text to sort, so the bytes are compared as they came.
    assert canonical_body(FORM, b"note=caf\xe9&amount=10") == b"note=caf\xe9&amount=10"
    assert canonical_body(FORM, b"note=caf\xe9") != canonical_body(FORM, b"note=caf\xe8")


@pytest.mark.parametrize("media_type", ["text/plain", "application/octet-stream", "", "text/csv"])
def test_other_media_types_are_compared_as_raw_bytes(media_type: str) -> None:
    body = b'{"b": 1, "a": 2}\n'

    assert canonical_body(media_type, body) == body


# canonical_multipart


def test_order_of_multipart_fields_and_files_does_not_matter() -> None:
    first = canonical_multipart(
        [("amount", "10"), ("note", "x")], [("a", "a.txt", "1" * 64), ("b", "b.txt", "2" * 64)]
    )
    second = canonical_multipart(
        [("note", "x"), ("amount", "10")], [("b", "b.txt", "2" * 64), ("a", "a.txt", "1" * 64)]
    )

    assert first == second


def test_order_of_files_under_one_field_name_matters() -> None:
    # A view reading request.FILES.getlist("attachments") sees them in this order.
    first = canonical_multipart(
        [], [("attachments", "a.pdf", "1" * 64), ("attachments", "b.pdf", "2" * 64)]
    )
    second = canonical_multipart(
        [], [("attachments", "b.pdf", "2" * 64), ("attachments", "a.pdf", "1" * 64)]
    )

    assert first != second


def test_changed_file_content_is_a_different_multipart_body() -> None:
    first = canonical_multipart([("amount", "10")], [("receipt", "r.txt", "1" * 64)])
    second = canonical_multipart([("amount", "10")], [("receipt", "r.txt", "2" * 64)])

    assert first != second


def test_changed_multipart_field_is_a_different_body() -> None:
    assert canonical_multipart([("amount", "10")], []) != canonical_multipart(
        [("amount", "11")], []
    )


def test_ignored_fields_are_dropped_from_multipart_bodies() -> None:
    first = canonical_multipart([("amount", "10"), ("nonce", "a")], [], {"nonce"})
    second = canonical_multipart([("nonce", "b"), ("amount", "10")], [], {"nonce"})

    assert first == second


# fingerprint


def test_fingerprint_is_64_lowercase_hex_characters() -> None:
    assert re.fullmatch(r"[0-9a-f]{64}", fingerprint("POST", "/a", b"{}"))


def test_method_case_does_not_change_the_fingerprint() -> None:
    assert fingerprint("post", "/a", b"{}") == fingerprint("POST", "/a", b"{}")


def test_method_changes_the_fingerprint() -> None:
    assert fingerprint("POST", "/a", b"{}") != fingerprint("PATCH", "/a", b"{}")


def test_path_changes_the_fingerprint() -> None:
    assert fingerprint("POST", "/a", b"{}") != fingerprint("POST", "/b", b"{}")


def test_query_string_changes_the_fingerprint() -> None:
    assert fingerprint("POST", "/a?x=1", b"{}") != fingerprint("POST", "/a?x=2", b"{}")


def test_body_changes_the_fingerprint() -> None:
    assert fingerprint("POST", "/a", b'{"a":1}') != fingerprint("POST", "/a", b'{"a":2}')


def test_moving_bytes_between_path_and_body_changes_the_fingerprint() -> None:
    assert fingerprint("POST", "/ab", b"c") != fingerprint("POST", "/a", b"bc")


def test_moving_bytes_between_method_and_path_changes_the_fingerprint() -> None:
    assert fingerprint("POST", "/a", b"") != fingerprint("POS", "T/a", b"")


def test_fingerprint_is_sha256_over_the_length_prefixed_parts() -> None:
    data = b"\x00\x00\x00\x04POST" + b"\x00\x00\x00\x02/a" + b'{"a":1}'

    assert fingerprint("post", "/a", b'{"a":1}') == hashlib.sha256(data).hexdigest()


# The default request fingerprint, through HTTP


def send(client: Client, body: bytes | str, content_type: str, url: str = URL) -> Any:
    return client.post(url, body, content_type=content_type, headers={"Idempotency-Key": "k"})


def assert_replay(first: Any, retry: Any) -> None:
    assert first.status_code == 201, first.content
    assert "Idempotent-Replayed" not in first
    assert retry.status_code == 201, retry.content
    assert retry["Idempotent-Replayed"] == "true"
    assert retry.content == first.content
    assert Charge.objects.count() == 1


def multipart(boundary: str, receipt: bytes, *, reverse: bool = False) -> tuple[bytes, str]:
    data: dict[str, Any] = {
        "amount": "10",
        "note": "lunch",
        "receipt": SimpleUploadedFile("receipt.txt", receipt, content_type="text/plain"),
    }
    if reverse:
        data = dict(reversed(data.items()))
    return encode_multipart(boundary, data), f"multipart/form-data; boundary={boundary}"


def upload(boundary: str, receipt: bytes) -> tuple[bytes, str]:
    """A multipart body for the DRF view, which reads request.data as a dict of lists.

    It therefore carries no amount to convert; the charge defaults to 0.
    """
    data = {"note": "lunch", "receipt": SimpleUploadedFile("receipt.txt", receipt)}
    return encode_multipart(boundary, data), f"multipart/form-data; boundary={boundary}"


@pytest.mark.django_db
def test_reordered_json_keys_are_the_same_request(client: Client) -> None:
    first = send(client, '{"amount": 10, "currency": "EUR"}', "application/json")
    retry = send(client, '{\n  "currency":"EUR",\n  "amount":10\n}', "application/json")

    assert_replay(first, retry)


@pytest.mark.django_db
def test_different_json_body_with_the_same_key_is_422(client: Client) -> None:
    send(client, '{"amount": 10}', "application/json")
    response = send(client, '{"amount": 11}', "application/json")

    assert_problem(response, 422, "key-reused")
    assert Charge.objects.count() == 1


@pytest.mark.django_db
def test_different_query_string_with_the_same_key_is_422(client: Client) -> None:
    send(client, '{"amount": 10}', "application/json", url=URL + "?account=1")
    response = send(client, '{"amount": 10}', "application/json", url=URL + "?account=2")

    assert_problem(response, 422, "key-reused")
    assert Charge.objects.count() == 1


@pytest.mark.django_db
def test_same_query_string_with_the_same_key_is_a_replay(client: Client) -> None:
    first = send(client, '{"amount": 10}', "application/json", url=URL + "?account=1")
    retry = send(client, '{"amount": 10}', "application/json", url=URL + "?account=1")

    assert_replay(first, retry)


@pytest.mark.django_db
def test_same_multipart_fields_and_file_with_another_boundary_are_the_same_request(
    client: Client,
) -> None:
    first = send(client, *multipart("BoundaryOne", b"receipt #1"))
    retry = send(client, *multipart("AnotherBoundary2", b"receipt #1", reverse=True))

    assert_replay(first, retry)
    assert Charge.objects.get().amount == 10


@pytest.mark.django_db
def test_same_multipart_upload_to_a_drf_view_with_another_boundary_is_a_replay(
    client: Client,
) -> None:
    first = send(client, *upload("BoundaryOne", b"receipt #1"), url=DRF_URL)
    retry = send(client, *upload("AnotherBoundary2", b"receipt #1"), url=DRF_URL)

    assert_replay(first, retry)


@pytest.mark.django_db
def test_multipart_upload_to_a_drf_view_with_different_file_content_is_422(
    client: Client,
) -> None:
    send(client, *upload("BoundaryOne", b"receipt #1"), url=DRF_URL)
    response = send(client, *upload("BoundaryOne", b"receipt #2"), url=DRF_URL)

    assert_problem(response, 422, "key-reused")
    assert Charge.objects.count() == 1


@pytest.mark.django_db
def test_multipart_with_different_file_content_is_422(client: Client) -> None:
    send(client, *multipart("BoundaryOne", b"receipt #1"))
    response = send(client, *multipart("BoundaryOne", b"receipt #2"))

    assert_problem(response, 422, "key-reused")
    assert Charge.objects.count() == 1


@pytest.mark.django_db
def test_json_with_a_lone_surrogate_escape_is_fingerprinted_not_a_server_error(
    client: Client,
) -> None:
    first = send(client, '{"amount": 10, "note": "\\ud800"}', "application/json")
    retry = send(client, '{"note": "\\ud800", "amount": 10}', "application/json")

    assert_replay(first, retry)


@pytest.mark.django_db
def test_json_nested_too_deeply_is_a_400_that_says_why(client: Client) -> None:
    response = send(client, b"[" * 100_000 + b"]" * 100_000, "application/json")

    problem = assert_problem(response, 400, "malformed-request")
    assert problem["detail"] == "The JSON body is nested too deeply to compare."


@pytest.mark.django_db
def test_reordered_form_fields_are_the_same_request(client: Client) -> None:
    first = send(client, "amount=10&note=lunch&tag=a&tag=b", FORM)
    retry = send(client, "tag=a&note=lunch&tag=b&amount=10", FORM)

    assert_replay(first, retry)
    assert Charge.objects.get().amount == 10


@pytest.mark.django_db
def test_form_with_a_different_value_is_422(client: Client) -> None:
    send(client, "amount=10&note=lunch", FORM)
    response = send(client, "amount=10&note=dinner", FORM)

    assert_problem(response, 422, "key-reused")


@pytest.mark.django_db
@pytest.mark.parametrize("method", ["post", "patch"])
def test_a_latin1_form_replays_and_another_accent_is_422(client: Client, method: str) -> None:
    # Not UTF-8: Django reads a POST's form as Latin-1, "café" or "cafè"; the form of another
    # method, which Django leaves unparsed, is compared byte for byte.
    def send_form(body: bytes) -> Any:
        return getattr(client, method)(
            URL, body, content_type=FORM, headers={"Idempotency-Key": "k"}
        )

    first = send_form(b"amount=10&note=caf\xe9")
    retry = send_form(b"amount=10&note=caf\xe9")
    other = send_form(b"amount=10&note=caf\xe8")

    assert_replay(first, retry)
    assert_problem(other, 422, "key-reused")


@pytest.mark.django_db
@override_settings(IDEMPOTENCY_FINGERPRINT_IGNORE_FIELDS=["nonce"])
def test_ignored_json_field_does_not_make_a_different_request(client: Client) -> None:
    first = send(client, '{"amount": 10, "nonce": "a1"}', "application/json")
    retry = send(client, '{"amount": 10, "nonce": "b2"}', "application/json")

    assert_replay(first, retry)


@pytest.mark.django_db
def test_json_field_that_is_not_ignored_makes_a_different_request(client: Client) -> None:
    send(client, '{"amount": 10, "nonce": "a1"}', "application/json")
    response = send(client, '{"amount": 10, "nonce": "b2"}', "application/json")

    assert_problem(response, 422, "key-reused")


@pytest.mark.django_db
@override_settings(IDEMPOTENCY_FINGERPRINT="tests.test_fingerprint.constant_fingerprint")
def test_custom_fingerprint_setting_is_used(client: Client) -> None:
    first = send(client, '{"amount": 10}', "application/json")
    retry = send(client, '{"amount": 99}', "application/json")

    assert_replay(first, retry)
    assert Charge.objects.get().amount == 10


# Golden values: a change to any of them changes the fingerprint of every stored request of that
# kind (a retry sent across the upgrade would get 422). Change one only on purpose, with a
# changelog entry saying which requests it affects.

GOLDEN = [
    pytest.param(
        "application/json",
        b'{"b": [1, 1.50, "\\u00e9"], "a": {"z": null, "y": true}}',
        b'{"a":{"y":true,"z":null},"b":[1,1.5,"\xc3\xa9"]}',
        "2741a32c745bae2f79ac221b895a59c854648e3aeea4e555f2dbc475ae4e03b5",
        id="json",
    ),
    pytest.param(
        FORM,
        b"to=mallory&amount=10&to=alice&note=a+b",
        b"amount=10&note=a+b&to=mallory&to=alice",
        "8903544959d4f23e995f75ceb2587913950dc104d253e2ac42c7ad3e6d8873ad",
        id="urlencoded",
    ),
    pytest.param(
        "application/octet-stream",
        b"\x00\x01raw",
        b"\x00\x01raw",
        "34f703a805d2fbf5e320c9f3507684280db3c1d269e97e3be671ed642817eff3",
        id="octet-stream",
    ),
    pytest.param(
        "", b"", b"", "4dc5270834c7ff4e13a6b46c15442957e56072dfcd7387ae56753652ac3a150f", id="none"
    ),
]


@pytest.mark.parametrize(("media_type", "body", "canonical", "digest"), GOLDEN)
def test_fingerprints_are_pinned_per_content_type(
    media_type: str, body: bytes, canonical: bytes, digest: str
) -> None:
    assert canonical_body(media_type, body) == canonical
    assert fingerprint("POST", "/pay/?x=1", canonical) == digest


def test_the_multipart_fingerprint_is_pinned() -> None:
    receipt = hashlib.sha256(b"receipt").hexdigest()
    canonical = canonical_multipart(
        [("to", "b"), ("amount", "10"), ("to", "a")], [("receipt", "r.txt", receipt)]
    )

    assert canonical == (
        b'{"fields":[["amount","10"],["to","b"],["to","a"]],'
        b'"files":[["receipt","r.txt","' + receipt.encode() + b'"]]}'
    )
    assert (
        fingerprint("POST", "/pay/?x=1", canonical)
        == "ca2e11400feefc7249b9da75f747ddeacf2dfdcdfa94f2ff51a33985c3f83f78"
    )
