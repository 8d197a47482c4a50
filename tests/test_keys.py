"""Idempotency keys: parsing client header values, and minting fresh or deterministic keys."""

from __future__ import annotations

import hashlib
import re
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ulid import ULID

from django_idempotency.core.keys import KEY_FORMATS, InvalidKey, mint_key, new_key, parse_key

VISIBLE_ASCII = st.characters(min_codepoint=0x21, max_codepoint=0x7E)
TOKENS = st.text(alphabet=VISIBLE_ASCII, min_size=1, max_size=255)
# Anything outside 0x20-0x7E except the tab, which parse_key trims when it surrounds the value.
OUTSIDE_PRINTABLE = st.characters(codec="utf-8", exclude_characters="\t").filter(
    lambda char: not 0x20 <= ord(char) <= 0x7E
)

A_UUID = "9f1c2b3a-4d5e-4f60-8a7b-1c2d3e4f5a6b"
A_ULID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"


def sf_string(value: str) -> str:
    """Quote a value as an RFC 9651 sf-String."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def spec_digest(*parts: str) -> str:
    """SHA-256 over the documented encoding, built without the package's code."""
    encoded = [part.encode("utf-8") for part in parts]
    data = len(encoded).to_bytes(4, "big")
    for chunk in encoded:
        data += len(chunk).to_bytes(4, "big") + chunk
    return hashlib.sha256(data).hexdigest()


# parse_key: accepted values


@pytest.mark.parametrize("raw", ["k1,k2", "k1, k2", "k1 ,k2", ",k1", "k1,"])
def test_repeated_key_headers_joined_by_the_server_are_refused(raw: str) -> None:
    with pytest.raises(InvalidKey, match="more than one key"):
        parse_key(raw)


def test_a_quoted_key_may_hold_a_comma() -> None:
    assert parse_key('"a,b"') == "a,b"


@pytest.mark.parametrize(
    "raw",
    ["a", "key-1", A_UUID, A_ULID, "!#$%&'()*+-./:;<=>?@[\\]^_`{|}~", 'a"b', "x" * 255],
)
def test_bare_visible_ascii_token_is_the_key_as_sent(raw: str) -> None:
    assert parse_key(raw) == raw


@pytest.mark.parametrize("raw", [" key-1", "key-1 ", "\tkey-1", "key-1\t", " \t key-1 \t "])
def test_surrounding_spaces_and_tabs_are_trimmed(raw: str) -> None:
    assert parse_key(raw) == "key-1"


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ('"key-1"', "key-1"),
        ('"with inner spaces"', "with inner spaces"),
        ('" leading and trailing "', " leading and trailing "),
        ('"say \\"hi\\""', 'say "hi"'),
        ('"back\\\\slash"', "back\\slash"),
        ('"\\\\"', "\\"),
        ('  "quoted"\t', "quoted"),
        ('" X "', " X "),  # Only spaces count as empty: any visible character is a key.
    ],
)
def test_quoted_sf_string_is_unquoted_and_unescaped(raw: str, key: str) -> None:
    assert parse_key(raw) == key


def test_quoted_key_of_255_characters_after_unquoting_is_accepted() -> None:
    # 255 characters once unquoted, although the header value itself is longer.
    raw = sf_string('"' * 255)

    assert parse_key(raw) == '"' * 255


# parse_key: rejected values


@pytest.mark.parametrize("raw", ["", " ", "\t", "  \t  ", '""', '"   "'])
def test_empty_or_blank_key_is_rejected(raw: str) -> None:
    with pytest.raises(InvalidKey, match="empty"):
        parse_key(raw)


def test_bare_key_longer_than_255_characters_is_rejected_with_its_length() -> None:
    with pytest.raises(InvalidKey, match="256 characters long; the limit is 255"):
        parse_key("x" * 256)


def test_quoted_key_longer_than_255_characters_after_unquoting_is_rejected() -> None:
    with pytest.raises(InvalidKey, match="the limit is 255"):
        parse_key(sf_string("x" * 256))


@pytest.mark.parametrize(
    "raw",
    [
        "key\x00",
        "ke\ny",
        "key\r\n",
        "ke\ty",
        "key\x1b",
        "key\x7f",
        "kéy",
        "ключ",
        "key\u00a0",
        "key 1",
        "key\x85",
    ],
)
def test_bare_key_with_control_space_or_non_ascii_characters_is_rejected(raw: str) -> None:
    with pytest.raises(InvalidKey, match="visible ASCII characters, or quote it"):
        parse_key(raw)


@pytest.mark.parametrize(
    "raw",
    [
        '"',
        '"unterminated',
        '"a"b"',
        '"ends in a backslash\\"',
        '"\\a"',
        '"\\n"',
        '"tab\tinside"',
        '"del\x7f"',
        '"café"',
        '"nul\x00"',
    ],
)
def test_badly_quoted_key_is_rejected_with_the_escaping_rule(raw: str) -> None:
    with pytest.raises(InvalidKey, match=r'escape only \\" and \\\\'):
        parse_key(raw)


# parse_key: key formats


@pytest.mark.parametrize(
    ("raw", "key_format"),
    [
        (A_UUID, "uuid"),
        (A_UUID.upper(), "uuid"),
        (str(uuid.UUID(int=0)), "uuid"),
        (f'"{A_UUID}"', "uuid"),
        (A_ULID, "ulid"),
        (A_ULID.lower(), "ulid"),
        ("7ZZZZZZZZZZZZZZZZZZZZZZZZZ", "ulid"),
        (A_UUID, "uuid_or_ulid"),
        (A_ULID, "uuid_or_ulid"),
    ],
)
def test_key_in_the_required_format_is_accepted(raw: str, key_format: str) -> None:
    assert parse_key(raw, key_format) == raw.strip('"')  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("raw", "key_format", "wanted"),
    [
        ("key-1", "uuid", "must be a UUID"),
        (A_ULID, "uuid", "must be a UUID"),
        (A_UUID.replace("-", ""), "uuid", "must be a UUID"),
        ("{" + A_UUID + "}", "uuid", "must be a UUID"),
        (A_UUID[:-1] + "g", "uuid", "must be a UUID"),
        ("key-1", "ulid", "must be a ULID"),
        (A_UUID, "ulid", "must be a ULID"),
        (A_ULID[:-1], "ulid", "must be a ULID"),
        (A_ULID + "0", "ulid", "must be a ULID"),
        (A_ULID[:-1] + "U", "ulid", "must be a ULID"),
        ("8ZZZZZZZZZZZZZZZZZZZZZZZZZ", "ulid", "must be a ULID"),
        ("key-1", "uuid_or_ulid", "must be a UUID or a ULID"),
        ("x" * 26, "uuid_or_ulid", "must be a UUID or a ULID"),
    ],
)
def test_key_in_another_format_is_rejected_naming_the_format(
    raw: str, key_format: str, wanted: str
) -> None:
    with pytest.raises(InvalidKey, match=wanted):
        parse_key(raw, key_format)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            '"unterminated',
            r"The key is not a valid quoted string: use printable ASCII and escape only \" and \\.",
        ),
        ('"  "', "The key is empty: send 1 to 255 visible ASCII characters."),
        ("", "The key is empty: send 1 to 255 visible ASCII characters."),
        (
            "k1,k2",
            "The request carries more than one key (repeated headers, or a comma in the key):"
            " send exactly one; quote a key that contains a comma.",
        ),
        (
            "key\x7f",
            "The key holds control, space or non-ASCII characters: send 1 to 255 visible ASCII"
            " characters, or quote it as a structured-field string.",
        ),
        ("k" * 256, "The key is 256 characters long; the limit is 255."),
        ("key-1", "The key must be a UUID or a ULID."),
    ],
)
def test_invalid_key_message_is_the_whole_text_the_client_reads(raw: str, message: str) -> None:
    # The 400 problem's detail carries the message as it is.
    with pytest.raises(InvalidKey) as raised:
        parse_key(raw, "uuid_or_ulid")

    assert str(raised.value) == message


def test_invalid_key_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse_key("")


# parse_key: properties


@given(TOKENS.filter(lambda token: not token.startswith('"') and "," not in token))
def test_any_visible_ascii_token_parses_to_itself(token: str) -> None:
    # A leading double quote announces an sf-String, so such values are tested quoted; a comma
    # is how servers join repeated headers (tested above).
    assert parse_key(token) == token


@given(TOKENS)
def test_any_visible_ascii_token_round_trips_through_an_sf_string(token: str) -> None:
    assert parse_key(sf_string(token)) == token


@given(st.text(), OUTSIDE_PRINTABLE, st.text(), st.booleans())
def test_any_character_outside_printable_ascii_is_rejected(
    before: str, bad: str, after: str, quoted: bool
) -> None:
    raw = before + bad + after
    with pytest.raises(InvalidKey):
        parse_key(sf_string(raw) if quoted else raw)


@settings(max_examples=200)
@given(st.text(), st.sampled_from([None, *KEY_FORMATS]))
def test_arbitrary_text_either_parses_or_raises_invalid_key(
    raw: str, key_format: str | None
) -> None:
    try:
        key = parse_key(raw, key_format)  # type: ignore[arg-type]
    except InvalidKey as exc:
        assert str(exc)
    else:
        assert 1 <= len(key) <= 255
        assert all(0x20 <= ord(char) <= 0x7E for char in key)


@given(
    st.text(alphabet=VISIBLE_ASCII.filter(lambda char: char not in '",'), min_size=26, max_size=26)
)
def test_any_26_character_token_either_is_a_ulid_or_raises_invalid_key(raw: str) -> None:
    try:
        key = parse_key(raw, "ulid")
    except InvalidKey as exc:
        assert "ULID" in str(exc)
    else:
        assert str(ULID.from_str(key)) == key.upper()


# new_key


def test_new_key_is_a_26_character_ulid() -> None:
    key = new_key()

    assert len(key) == 26
    assert str(ULID.from_str(key)) == key


def test_new_key_is_accepted_as_a_ulid_key() -> None:
    key = new_key()

    assert parse_key(key, "ulid") == key
    assert parse_key(key, "uuid_or_ulid") == key


def test_new_keys_are_unique() -> None:
    keys = {new_key() for _ in range(10_000)}

    assert len(keys) == 10_000


# mint_key


def test_mint_key_is_the_documented_sha256_encoding() -> None:
    expected = "fe923497547b2c192c99881680e19a9b8b280ce8317779a4f9317129892f1153"

    assert spec_digest("default", "order-42", "refund") == expected
    assert mint_key("order-42", "refund") == expected


def test_mint_key_with_a_namespace_puts_the_namespace_first() -> None:
    assert mint_key("order-42", namespace="payments") == spec_digest("payments", "order-42")


def test_mint_key_encodes_parts_as_utf8() -> None:
    assert mint_key("café", "ключ") == spec_digest("default", "café", "ключ")


def test_same_parts_give_the_same_key() -> None:
    assert mint_key("order-42", 7, namespace="n") == mint_key("order-42", 7, namespace="n")


def test_minted_key_is_64_lowercase_hex_characters() -> None:
    assert re.fullmatch(r"[0-9a-f]{64}", mint_key("order-42"))


def test_minted_key_is_accepted_by_parse_key() -> None:
    key = mint_key("order-42", "refund")

    assert parse_key(key) == key


def test_moving_characters_between_parts_gives_a_different_key() -> None:
    assert mint_key("ab", "c") != mint_key("a", "bc")


def test_different_namespace_gives_a_different_key() -> None:
    assert mint_key("order-42", namespace="a") != mint_key("order-42", namespace="b")


def test_namespace_is_not_just_another_part() -> None:
    assert mint_key("b", namespace="a") != mint_key("a", "b")


def test_order_of_parts_matters() -> None:
    assert mint_key("a", "b") != mint_key("b", "a")


def test_ints_and_uuids_are_encoded_as_their_str() -> None:
    order_id = uuid.UUID(A_UUID)

    assert mint_key(42, order_id) == mint_key("42", A_UUID)
    assert mint_key(42, order_id) == spec_digest("default", "42", A_UUID)


def test_mint_key_without_parts_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="at least one"):
        mint_key()


@pytest.mark.parametrize("blank", ["", " ", "\t\n"])
@pytest.mark.parametrize("position", [0, 1, 2])
def test_blank_part_is_a_value_error_wherever_it_stands(blank: str, position: int) -> None:
    parts = ["order-42", "refund", "3"]
    parts[position] = blank
    with pytest.raises(ValueError, match=re.escape("mint_key() parts must not be blank.")):
        mint_key(*parts)


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ((), "mint_key() needs at least one natural-key part."),
        (("order-42", " "), "mint_key() parts must not be blank."),
    ],
)
def test_mint_key_errors_say_what_is_wrong_in_full(parts: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError) as raised:
        mint_key(*parts)

    assert str(raised.value) == message


@given(st.lists(st.text(min_size=1).filter(str.strip), min_size=1, max_size=5), st.text())
def test_minted_key_always_matches_the_documented_encoding(
    parts: list[str], namespace: str
) -> None:
    assert mint_key(*parts, namespace=namespace) == spec_digest(namespace, *parts)
