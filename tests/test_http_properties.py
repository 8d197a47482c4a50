"""Property-based tests of the guard's HTTP surface behind Django's default middleware and CSRF."""

from __future__ import annotations

import dataclasses
import json
import random
import string
import sys
import zlib
from collections import defaultdict, deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qsl, quote, quote_plus, urlencode

import django
import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.test import Client
from hypothesis import HealthCheck, Phase, assume, event, given, note
from hypothesis import seed as hypothesis_seed
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from pytest_django.fixtures import Settings

from django_idempotency.models import IdempotencyRecord
from tests.factories import UserFactory
from tests.models import Charge
from tests.property_urls import CHARGE_PREFIX, EXECUTIONS, FORM, GUARDED_METHODS, MULTIPART

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.property_urls")]

# What `django-admin startproject` generates: the stack a real project puts in front of a view.
DEFAULT_MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
TARGETS = {"plain": "/plain/", "drf": "/drf/"}
GUARD_STATUSES = frozenset({400, 409, 413, 422, 503})
PROBLEM_FIELDS = frozenset({"type", "title", "status", "detail"})
JSON = "application/json"
OCTET = "application/octet-stream"
# Beyond ±2^53 the fingerprint keeps integers exact and floats as doubles: never cross there.
EXACT_INT_LIMIT = 2**53

# Bounded so the file runs in seconds; seeded (and no example database) so a failure found on
# one machine is found on every machine, and nothing is written into the checkout. The seed is
# the run's (tox.ini runs the suite on several databases, Djangos and Pythons): each run draws
# requests of its own, so the runs together try five times as many as one, not the same ones
# five times.
RUN = f"{connection.vendor} {django.VERSION[:2]} {django_settings.USE_TZ} {sys.version_info[:2]}"
RUN_SEED = zlib.crc32(RUN.encode())
PROPERTY_SETTINGS = hypothesis_settings(
    max_examples=20,
    # No explain phase: it is slow over HTTP, and the plain falsifying example says it all.
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

T = TypeVar("T")


def property_test(test: T) -> T:
    """A property test, bounded by PROPERTY_SETTINGS and seeded by the run."""
    return hypothesis_seed(RUN_SEED)(PROPERTY_SETTINGS(test))


Kind = Literal["json", "form", "multipart", "octet", "empty"]


# --- Requests: what is said (Payload) apart from how it is spelled (Style) ---------------------


@dataclasses.dataclass(frozen=True)
class Payload:
    """The meaning of a body; `encode` spells it out."""

    kind: Kind
    value: Any = None  # json
    fields: tuple[tuple[str, str], ...] = ()  # form, multipart: in the order sent
    files: tuple[tuple[str, str, bytes], ...] = ()  # multipart: (field, file name, content)
    raw: bytes = b""  # octet


@dataclasses.dataclass(frozen=True)
class Style:
    """Incidental spelling that never changes what a request means."""

    seed: int  # Order of JSON object keys and of distinct form fields.
    spaced: bool
    ascii_only: bool
    numbers: Literal["plain", "float", "exponent"]
    plus_spaces: bool
    boundary: str


@dataclasses.dataclass(frozen=True)
class Call:
    method: str
    path: str
    payload: Payload
    style: Style
    key: str | None  # The raw Idempotency-Key header value, as a WSGI server hands it over.
    csrf_in_field: bool  # Honoured for POST forms only: Django reads the field from POST alone.

    def token_in_field(self) -> bool:
        return (
            self.csrf_in_field
            and self.method == "POST"
            and self.payload.kind in ("form", "multipart")
        )


def encode(payload: Payload, style: Style, csrf_token: str | None) -> tuple[str | None, bytes]:
    """The content type and bytes of a payload spelt in `style`."""
    rng = random.Random(style.seed)
    if payload.kind == "json":
        return JSON, _dump_json(payload.value, style, rng).encode()
    fields = payload.fields
    if csrf_token is not None:
        fields = (("csrfmiddlewaretoken", csrf_token), *fields)
    if payload.kind == "form":
        quote_via = quote_plus if style.plus_spaces else quote
        pairs = _reorder(fields, rng, _name)
        return FORM, urlencode(pairs, quote_via=quote_via).encode()
    if payload.kind == "multipart":
        boundary = "PropertyBoundary" + style.boundary
        parts: list[tuple[str, tuple[Any, ...]]] = [("field", field) for field in fields]
        parts += [("file", upload) for upload in payload.files]
        chunks = []
        for part_kind, part in _reorder(parts, rng, lambda item: (item[0], item[1][0])):
            if part_kind == "field":
                name, value = part
                head = f'Content-Disposition: form-data; name="{name}"'
                content = value.encode()
            else:
                name, file_name, content = part
                head = (
                    f'Content-Disposition: form-data; name="{name}"; filename="{file_name}"\r\n'
                    f"Content-Type: {OCTET}"
                )
            chunks.append(f"--{boundary}\r\n{head}\r\n\r\n".encode() + content + b"\r\n")
        chunks.append(f"--{boundary}--\r\n".encode())
        return f"{MULTIPART}; boundary={boundary}", b"".join(chunks)
    if payload.kind == "octet" and payload.raw:
        return OCTET, payload.raw
    return None, b""


def _reorder(items: Sequence[T], rng: random.Random, name_of: Callable[[T], Hashable]) -> list[T]:
    """Shuffle distinct names, keeping the order of each repeated name's values."""
    slots = [name_of(item) for item in items]
    rng.shuffle(slots)
    queues: defaultdict[Hashable, deque[T]] = defaultdict(deque)
    for item in items:
        queues[name_of(item)].append(item)
    return [queues[slot].popleft() for slot in slots]


def _name(field: tuple[str, str]) -> str:
    return field[0]


def _dump_json(value: Any, style: Style, rng: random.Random) -> str:
    comma, colon = (", ", ": ") if style.spaced else (",", ":")
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        if abs(value) > EXACT_INT_LIMIT or style.numbers == "plain":
            return str(value)
        return f"{value}.0" if style.numbers == "float" else f"{value}e0"
    if isinstance(value, float):
        # Every spelling reads back as the same double.
        spelt = {"plain": repr(value), "float": f"{value:.17g}", "exponent": f"{value:.17e}"}
        number = spelt[style.numbers]
        if abs(value) > EXACT_INT_LIMIT and number.lstrip("-").isdigit():
            # Still a double: as an integer literal it would be compared exactly (SPEC §3).
            number += ".0"
        return number
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=style.ascii_only)
    if isinstance(value, list):
        return "[" + comma.join(_dump_json(item, style, rng) for item in value) + "]"
    names = list(value)
    rng.shuffle(names)
    members = (
        json.dumps(name, ensure_ascii=style.ascii_only)
        + colon
        + _dump_json(value[name], style, rng)
        for name in names
    )
    return ("{\n" if style.spaced else "{") + comma.join(members) + "}"


def canonical(payload: Payload) -> Hashable:
    """An oracle independent of the library: equal exactly when SPEC §3 says the bodies are.

    Numbers compare as doubles: a little coarser than RFC 8785 for integers beyond 2^53, so two
    bodies it calls different are surely different.
    """
    if payload.kind == "json":
        return ("json", _canonical_json(payload.value))
    if payload.kind == "form":
        return ("form", _grouped(payload.fields))
    if payload.kind == "multipart":
        files = [(name, (file_name, content)) for name, file_name, content in payload.files]
        return ("multipart", _grouped(payload.fields), _grouped(files))
    return ("raw", payload.raw)


def _canonical_json(value: Any) -> Hashable:
    if value is None or isinstance(value, bool):
        return ("literal", value)
    if isinstance(value, (int, float)):
        return ("number", float(value))
    if isinstance(value, str):
        return ("string", value)
    if isinstance(value, list):
        return ("array", tuple(_canonical_json(item) for item in value))
    return ("object", frozenset((name, _canonical_json(item)) for name, item in value.items()))


def _grouped(pairs: Sequence[tuple[str, Any]]) -> Hashable:
    """Fields by name; a repeated name keeps the order of its values."""
    groups: defaultdict[str, list[Any]] = defaultdict(list)
    for name, value in pairs:
        groups[name].append(value)
    return frozenset((name, tuple(values)) for name, values in groups.items())


# --- Strategies ----------------------------------------------------------------------------------

VISIBLE = "".join(chr(code) for code in range(0x21, 0x7F))
BARE = VISIBLE.replace(",", "")  # A comma is where a server joins two repeated headers.
SF_STRING = "".join(chr(code) for code in range(0x20, 0x7F))
CONTROL = [chr(code) for code in [*range(0x00, 0x20), 0x7F]]
unicode = st.characters(exclude_categories=["Cs"])  # No lone surrogates: encodable as UTF-8.
text = st.text(unicode, max_size=12)


def bare_keys(min_size: int = 1, max_size: int = 40) -> st.SearchStrategy[str]:
    # A leading quote would make it a (malformed) sf-String.
    return st.text(BARE, min_size=min_size, max_size=max_size).map(
        lambda key: "k" + key[1:] if key.startswith('"') else key
    )


def _quoted(content: str) -> str:
    return '"' + content.replace("\\", "\\\\").replace('"', '\\"') + '"'


ows = st.sampled_from(["", " ", "\t", "  "])
valid_keys = st.one_of(
    bare_keys(),
    bare_keys(255, 255),
    st.tuples(
        ows, st.text(SF_STRING, min_size=1, max_size=40).filter(str.strip).map(_quoted), ows
    ).map("".join),
    st.text(SF_STRING, min_size=255, max_size=255).filter(str.strip).map(_quoted),
)
joined_keys = st.one_of(  # Two Idempotency-Key headers, as gunicorn joins them.
    st.tuples(bare_keys(), st.sampled_from([",", ", ", " ,", " , ", ",\t"]), bare_keys()).map(
        "".join
    ),
    bare_keys().map(lambda key: f"{key}, {key}"),
    st.tuples(bare_keys(), bare_keys()).map(lambda keys: f'"{keys[0]}", "{keys[1]}"'),
    st.tuples(bare_keys(), bare_keys()).map(lambda keys: f'"{keys[0]}",{keys[1]}'),
)
non_ascii = st.characters(min_codepoint=0x80, exclude_categories=["Cs"])
invalid_keys = st.one_of(
    # Empty or blank; an sf-String that is blank, unterminated, or escapes anything but \" and \\.
    st.sampled_from(["", " ", "\t", "  \t ", '""', '" "', '"', '"abc', '"abc"x', '"a\\b"']),
    bare_keys(256, 300),
    st.text(SF_STRING, min_size=256, max_size=300).filter(str.strip).map(_quoted),
    st.tuples(bare_keys(), st.sampled_from([*CONTROL, " "]), bare_keys()).map("".join),
    st.tuples(bare_keys(0, 10), non_ascii, bare_keys(0, 10)).map("".join),
    st.tuples(bare_keys(), st.sampled_from([c for c in CONTROL if c != "\t"]), bare_keys()).map(
        lambda parts: _quoted("".join(parts))
    ),
    st.tuples(bare_keys(0, 10), non_ascii, bare_keys(0, 10)).map(
        lambda parts: _quoted("".join(parts))
    ),
    joined_keys,
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(text, children, max_size=4),
    max_leaves=10,
)
form_names = st.text(unicode, min_size=1, max_size=6).filter(
    lambda name: name != "csrfmiddlewaretoken"  # Django's CSRF reads a field of that name.
)
part_names = st.text(string.ascii_letters + string.digits + "_-.", min_size=1, max_size=6)
file_names = st.text(string.ascii_lowercase + string.digits, min_size=1, max_size=6).map(
    lambda stem: stem + ".bin"
)


def _fields(names: st.SearchStrategy[str]) -> st.SearchStrategy[tuple[tuple[str, str], ...]]:
    # Names from a pool of one to three, so that repeated fields are common.
    return (
        st.lists(names, min_size=1, max_size=3, unique=True)
        .flatmap(lambda pool: st.lists(st.tuples(st.sampled_from(pool), text), max_size=6))
        .map(tuple)
    )


def payloads(kind: Kind) -> st.SearchStrategy[Payload]:
    if kind == "json":
        return st.builds(Payload, kind=st.just("json"), value=json_values)
    if kind == "form":
        return st.builds(Payload, kind=st.just("form"), fields=_fields(form_names))
    if kind == "multipart":
        uploads = st.lists(
            st.tuples(part_names, file_names, st.binary(max_size=64)), max_size=3
        ).map(tuple)
        return st.builds(
            Payload, kind=st.just("multipart"), fields=_fields(part_names), files=uploads
        )
    if kind == "octet":
        return st.builds(Payload, kind=st.just("octet"), raw=st.binary(min_size=1, max_size=64))
    return st.just(Payload("empty"))


KINDS: tuple[Kind, ...] = ("json", "form", "multipart", "octet", "empty")
styles = st.builds(
    Style,
    seed=st.integers(0, 2**16),
    spaced=st.booleans(),
    ascii_only=st.booleans(),
    numbers=st.sampled_from(["plain", "float", "exponent"]),
    plus_spaces=st.booleans(),
    boundary=st.text(string.ascii_letters + string.digits, min_size=1, max_size=24),
)
methods = st.sampled_from(GUARDED_METHODS)


# --- The client ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Browser:
    """A logged-in session that passes CSRF the way a browser page (or a SPA) does."""

    client: Client
    csrf_token: str

    def send(self, call: Call) -> Any:
        in_field = call.token_in_field()
        content_type, body = encode(call.payload, call.style, self.csrf_token if in_field else None)
        return self.raw(call.method, call.path, body, content_type, call.key, in_field=in_field)

    def raw(
        self,
        method: str,
        path: str,
        body: bytes,
        content_type: str | None,
        key: str | None,
        *,
        in_field: bool = False,
        strict: bool = True,
    ) -> Any:
        """Send one request; `strict` holds every 4xx in GUARD_STATUSES to be the guard's."""
        headers = {} if in_field else {"X-CSRFToken": self.csrf_token}
        if key is not None:
            headers["Idempotency-Key"] = key  # Sent as is, as a WSGI server hands it over.
        response = self.client.generic(
            method, path, body, content_type=content_type or OCTET, headers=headers
        )
        check_response(response, strict=strict)
        return response


@pytest.fixture
def browser(settings: Settings) -> Iterator[Browser]:
    settings.MIDDLEWARE = DEFAULT_MIDDLEWARE
    client = Client(enforce_csrf_checks=True)
    client.force_login(UserFactory())
    client.get("/csrf/")  # After the login, which rotates the token.
    EXECUTIONS.clear()
    yield Browser(client, client.cookies["csrftoken"].value)
    EXECUTIONS.clear()


def reset() -> None:
    """Each example starts from an empty store, so its keys need not be unique."""
    EXECUTIONS.clear()
    IdempotencyRecord.objects.all().delete()
    Charge.objects.filter(reference__startswith=CHARGE_PREFIX).delete()


def executions() -> int:
    return sum(EXECUTIONS.values())


# --- Assertions ----------------------------------------------------------------------------------


def check_response(response: Any, *, strict: bool = True) -> None:
    """Properties 1 and 2, for every response of every test.

    The views themselves answer 200 or 201 to every well-formed body, so there a 4xx of the
    guard's kinds can only come from the guard. A body nobody can parse may also be refused by
    Django or DRF (their own 400 or 415), which is not the guard's to format.
    """
    assert response.status_code < 500, response.content
    is_problem = response.get("Content-Type", "").startswith("application/problem+json")
    if is_problem or (strict and response.status_code in GUARD_STATUSES):
        assert_problem(response, response.status_code)


def assert_problem(response: Any, status: int, slug: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json", response.content
    problem = json.loads(response.content)
    assert set(problem) >= PROBLEM_FIELDS, problem
    assert problem["status"] == status
    assert all(
        isinstance(problem[name], str) and problem[name] for name in PROBLEM_FIELDS - {"status"}
    )
    if slug is not None:
        assert problem["type"].endswith(slug), problem
    return problem  # type: ignore[no-any-return]


def assert_ran(response: Any, count: int) -> None:
    assert response.status_code in (200, 201), response.content
    assert "Idempotent-Replayed" not in response
    assert executions() == count


def assert_replay(retry: Any, first: Any) -> None:
    """Property 3: the stored response, marked as replayed, and the view did not run."""
    assert (retry.status_code, retry.content) == (first.status_code, first.content)
    assert retry["Idempotent-Replayed"] == "true"
    assert retry["Content-Type"] == first["Content-Type"]
    assert retry["X-Execution"] == first["X-Execution"]
    assert executions() == 1
    # The view's write committed with the stored response, once.
    assert Charge.objects.filter(reference__startswith=CHARGE_PREFIX).count() == 1


def stored_record() -> dict[str, Any]:
    return dict(IdempotencyRecord.objects.values().get())


# --- Properties ----------------------------------------------------------------------------------

target_ids = pytest.mark.parametrize("target", list(TARGETS))
# One search per kind of body, so every kind gets its share whatever Hypothesis favours.
kind_ids = pytest.mark.parametrize("kind", KINDS)
respellable_kind_ids = pytest.mark.parametrize("kind", ["json", "form", "multipart"])


@st.composite
def calls(
    draw: st.DrawFn, target: str, kind: Kind, keys: st.SearchStrategy[str] = valid_keys
) -> Call:
    call = Call(
        method=draw(methods),
        path=TARGETS[target],
        payload=draw(payloads(kind)),
        style=draw(styles),
        key=draw(keys),
        csrf_in_field=draw(st.booleans()),
    )
    event(f"{call.method} {kind}")  # Coverage, with --hypothesis-show-statistics.
    return call


@target_ids
@kind_ids
@property_test
@given(data=st.data())
def test_same_request_again_replays(
    browser: Browser, target: str, kind: Kind, data: st.DataObject
) -> None:
    reset()
    call = data.draw(calls(target, kind), label="call")

    first = browser.send(call)
    assert_ran(first, 1)
    retry = browser.send(call)

    assert_replay(retry, first)


@target_ids
@respellable_kind_ids
@property_test
@given(data=st.data(), respelt=styles)
def test_same_request_spelt_differently_replays(
    browser: Browser, target: str, kind: Kind, data: st.DataObject, respelt: Style
) -> None:
    """Reordered JSON keys or distinct fields, 1 / 1.0 / 1e0, a new boundary: one request."""
    reset()
    call = data.draw(calls(target, kind), label="call")
    note(f"respelt: {respelt!r}")
    note(f"first body: {encode(call.payload, call.style, None)[1]!r}")
    note(f"retry body: {encode(call.payload, respelt, None)[1]!r}")

    first = browser.send(call)
    assert_ran(first, 1)
    retry = browser.send(dataclasses.replace(call, style=respelt))

    assert_replay(retry, first)


@st.composite
def changes(draw: st.DrawFn, call: Call) -> tuple[str, Call]:
    """The same key on a request that differs in its body, its method or its path."""
    repeated = _repeated_names(call.payload.fields)
    what = draw(st.sampled_from(["body", "method", "path"] + (["value order"] if repeated else [])))
    if what == "value order":
        # Only the order of one repeated field's values changes: a different request (SPEC §3).
        name = draw(st.sampled_from(repeated))
        values = [value for field, value in call.payload.fields if field == name]
        rotated = iter(values[1:] + values[:1])
        fields = tuple(
            (field, next(rotated) if field == name else value)
            for field, value in call.payload.fields
        )
        payload = dataclasses.replace(call.payload, fields=fields)
        return what, dataclasses.replace(call, payload=payload)
    if what == "method":
        method = draw(st.sampled_from([m for m in GUARDED_METHODS if m != call.method]))
        return what, dataclasses.replace(call, method=method)
    if what == "path":
        other = next(p for p in TARGETS.values() if p != call.path)
        path = draw(st.sampled_from([call.path + "?v=1", call.path + "again/", other]))
        return what, dataclasses.replace(call, path=path)
    kind = "octet" if call.payload.kind == "empty" else call.payload.kind
    payload = draw(payloads(kind))
    assume(canonical(payload) != canonical(call.payload))
    return what, dataclasses.replace(call, payload=payload, style=draw(styles))


def _repeated_names(fields: Sequence[tuple[str, str]]) -> list[str]:
    """Names sent more than once with values that are not all equal."""
    values: defaultdict[str, list[str]] = defaultdict(list)
    for name, value in fields:
        values[name].append(value)
    return sorted(name for name, seen in values.items() if len(set(seen)) > 1)


@target_ids
@kind_ids
@property_test
@given(data=st.data())
def test_same_key_on_a_different_request_is_422_and_keeps_the_stored_response(
    browser: Browser, target: str, kind: Kind, data: st.DataObject
) -> None:
    reset()
    call = data.draw(calls(target, kind), label="call")
    what, changed = data.draw(changes(call), label="change")
    event(f"changed {what}")

    first = browser.send(call)
    assert_ran(first, 1)
    stored = stored_record()
    mismatch = browser.send(changed)

    assert_problem(mismatch, 422, "key-reused")
    assert executions() == 1
    assert stored_record() == stored
    assert_replay(browser.send(call), first)


@target_ids
@kind_ids
@property_test
@given(data=st.data())
def test_malformed_or_repeated_key_is_400(
    browser: Browser, target: str, kind: Kind, data: st.DataObject
) -> None:
    reset()
    call = data.draw(calls(target, kind, invalid_keys), label="call")

    for _attempt in range(2):  # Nothing is stored: the same mistake gets the same answer.
        assert_problem(browser.send(call), 400, "invalid-key")

    assert executions() == 0
    assert not IdempotencyRecord.objects.exists()


garbage_types = st.sampled_from(
    [
        JSON,
        "application/json; charset=latin-1",
        "application/merge-patch+json",
        FORM,
        f"{FORM}; charset=utf-8",
        MULTIPART,
        f"{MULTIPART}; boundary=PropertyBoundary",
        f"{MULTIPART}; boundary=",
        "text/plain",
        OCTET,
    ]
)
garbage = st.one_of(
    st.binary(min_size=1, max_size=200),
    st.just(b'{"a":' * 2000),  # Nested past any recursion limit.
    st.just(b"--PropertyBoundary\r\nContent-Disposition: form-data\r\n\r\nx\r\n"),
    st.just(b"a=%ff&b=%&c"),
)


@target_ids
@property_test
@given(method=methods, content_type=garbage_types, body=garbage, key=valid_keys)
def test_malformed_bodies_never_cause_a_server_error(
    browser: Browser, target: str, method: str, content_type: str, body: bytes, key: str
) -> None:
    """A body nobody can parse: 4xx from whoever noticed, never 5xx; a retry gets the same."""
    reset()
    note(f"{method} {TARGETS[target]} {content_type!r} key={key!r} body={body[:80]!r}")

    first = browser.raw(method, TARGETS[target], body, content_type, key, strict=False)
    retry = browser.raw(method, TARGETS[target], body, content_type, key, strict=False)

    assert retry.status_code == first.status_code
    if first.status_code in (200, 201):
        assert_replay(retry, first)
    else:  # A refusal means nothing happened: the key was given back.
        assert not IdempotencyRecord.objects.exists()


# --- The named cases, pinned whatever the random search finds -----------------------------------

KEY = "01J9Z8X7W6V5T4S3R2Q1P0NMKA"


def multipart(boundary: str, *parts: tuple[str, str | bytes, str | None]) -> tuple[str, bytes]:
    """(content type, body) from (name, content, file name or None) parts, in order."""
    chunks = []
    for name, content, file_name in parts:
        head = f'Content-Disposition: form-data; name="{name}"'
        if file_name is not None:
            head += f'; filename="{file_name}"\r\nContent-Type: {OCTET}'
        data = content.encode() if isinstance(content, str) else content
        chunks.append(f"--{boundary}\r\n{head}\r\n\r\n".encode() + data + b"\r\n")
    chunks.append(f"--{boundary}--\r\n".encode())
    return f"{MULTIPART}; boundary={boundary}", b"".join(chunks)


@target_ids
@pytest.mark.parametrize("kind", ["form", "multipart"])
def test_post_form_with_csrf_token_in_a_field_runs_once_and_replays(
    browser: Browser, target: str, kind: str
) -> None:
    """CSRF reads the POST form before the guard: the body must still be fingerprinted."""
    token = browser.csrf_token
    if kind == "form":
        content_type, body = FORM, f"csrfmiddlewaretoken={token}&amount=10".encode()
    else:
        content_type, body = multipart(
            "b1", ("csrfmiddlewaretoken", token, None), ("amount", "10", None), ("f", b"\0", "a")
        )

    first = browser.raw("POST", TARGETS[target], body, content_type, KEY, in_field=True)
    assert_ran(first, 1)

    assert_replay(
        browser.raw("POST", TARGETS[target], body, content_type, KEY, in_field=True), first
    )


@target_ids
@pytest.mark.parametrize("method", ["PUT", "PATCH", "DELETE", "POST"])
@pytest.mark.parametrize("changed_part", ["field", "file"])
def test_multipart_body_is_part_of_the_fingerprint_for_every_method(
    browser: Browser, target: str, method: str, changed_part: str
) -> None:
    original = multipart("b1", ("amount", "10", None), ("doc", b"first", "doc.txt"))
    changed = multipart(
        "b2",
        ("amount", "99" if changed_part == "field" else "10", None),
        ("doc", b"first" if changed_part == "field" else b"other", "doc.txt"),
    )
    first = browser.raw(method, TARGETS[target], original[1], original[0], KEY)
    assert_ran(first, 1)

    assert_problem(
        browser.raw(method, TARGETS[target], changed[1], changed[0], KEY), 422, "key-reused"
    )
    assert_replay(browser.raw(method, TARGETS[target], original[1], original[0], KEY), first)


@target_ids
@pytest.mark.parametrize("method", ["PUT", "PATCH", "POST"])
def test_new_multipart_boundary_is_the_same_request(
    browser: Browser, target: str, method: str
) -> None:
    parts: list[tuple[str, str | bytes, str | None]] = [
        ("amount", "10", None),
        ("doc", b"first", "doc.txt"),
    ]
    content_type, body = multipart("b1", *parts)
    first = browser.raw(method, TARGETS[target], body, content_type, KEY)
    assert_ran(first, 1)
    content_type, body = multipart("another-boundary", *parts)

    assert_replay(browser.raw(method, TARGETS[target], body, content_type, KEY), first)


@target_ids
@pytest.mark.parametrize("header", ["k1,k2", "k1, k2", "k1,k1", '"k1", "k2"'])
def test_key_header_sent_twice_is_400(browser: Browser, target: str, header: str) -> None:
    """Gunicorn joins two Idempotency-Key headers with a comma into one WSGI value."""
    response = browser.raw("POST", TARGETS[target], b'{"amount": 1}', JSON, header)

    assert_problem(response, 400, "invalid-key")
    assert executions() == 0


@target_ids
@pytest.mark.parametrize("method", ["POST", "PATCH"])
@pytest.mark.parametrize("spelling", ["1.0", "1e0", "10e-1", "1.000", "1E+0"])
def test_json_numbers_in_any_spelling_are_the_same_request(
    browser: Browser, target: str, method: str, spelling: str
) -> None:
    first = browser.raw(method, TARGETS[target], b'{"amount": 1, "currency": "EUR"}', JSON, KEY)
    assert_ran(first, 1)
    respelt = f'{{"currency":"EUR","amount":{spelling}}}'.encode()

    assert_replay(browser.raw(method, TARGETS[target], respelt, JSON, KEY), first)


@target_ids
@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH"])
def test_reordered_json_keys_are_the_same_request(
    browser: Browser, target: str, method: str
) -> None:
    first = browser.raw(method, TARGETS[target], b'{"a": {"x": 1, "y": [1, 2]}, "b": 2}', JSON, KEY)
    assert_ran(first, 1)
    reordered = b'{"b":2,"a":{"y":[1,2],"x":1}}'

    assert_replay(browser.raw(method, TARGETS[target], reordered, JSON, KEY), first)


@target_ids
@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH"])
@pytest.mark.parametrize("kind", ["form", "multipart"])
def test_repeated_field_value_order_is_a_different_request(
    browser: Browser, target: str, method: str, kind: str
) -> None:
    """`to=a&to=b` and `to=b&to=a` differ: a view reading request.POST["to"] sees another value."""

    def body(*values: str) -> tuple[str, bytes]:
        if kind == "form":
            return FORM, "&".join(f"to={value}" for value in values).encode()
        return multipart("b1", *(("to", value, None) for value in values))

    content_type, original = body("a", "b")
    first = browser.raw(method, TARGETS[target], original, content_type, KEY)
    assert_ran(first, 1)

    swapped = body("b", "a")[1]
    assert_problem(
        browser.raw(method, TARGETS[target], swapped, content_type, KEY), 422, "key-reused"
    )
    assert_replay(browser.raw(method, TARGETS[target], original, content_type, KEY), first)


@target_ids
@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH"])
@pytest.mark.parametrize("kind", ["form", "multipart"])
def test_reordered_distinct_fields_are_the_same_request(
    browser: Browser, target: str, method: str, kind: str
) -> None:
    def body(*pairs: tuple[str, str]) -> tuple[str, bytes]:
        if kind == "form":
            return FORM, urlencode(pairs).encode()
        return multipart("b1", *((name, value, None) for name, value in pairs))

    content_type, original = body(("a", "1"), ("to", "x"), ("b", "2"), ("to", "y"))
    first = browser.raw(method, TARGETS[target], original, content_type, KEY)
    assert_ran(first, 1)
    reordered = body(("b", "2"), ("to", "x"), ("to", "y"), ("a", "1"))[1]

    assert_replay(browser.raw(method, TARGETS[target], reordered, content_type, KEY), first)


@target_ids
@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_octet_stream_body_is_part_of_the_fingerprint(
    browser: Browser, target: str, method: str
) -> None:
    first = browser.raw(method, TARGETS[target], b"\x00first", OCTET, KEY)
    assert_ran(first, 1)

    assert_problem(
        browser.raw(method, TARGETS[target], b"\x00other", OCTET, KEY), 422, "key-reused"
    )
    assert_replay(browser.raw(method, TARGETS[target], b"\x00first", OCTET, KEY), first)


@target_ids
def test_request_without_a_key_runs_every_time(browser: Browser, target: str) -> None:
    for count in (1, 2):
        assert_ran(browser.raw("POST", TARGETS[target], b'{"amount": 1}', JSON, None), count)
    assert not IdempotencyRecord.objects.exists()


def test_oracle_agrees_with_the_spec_on_the_named_cases() -> None:
    """The test's own notion of 'the same request', checked against SPEC §3's examples."""
    json_body = Payload("json", {"a": 1, "b": [1, 2]})
    assert canonical(json_body) == canonical(Payload("json", {"b": [1.0, 2e0], "a": 1}))
    assert canonical(json_body) != canonical(Payload("json", {"a": 1, "b": [2, 1]}))
    assert canonical(Payload("json", True)) != canonical(Payload("json", 1))
    form = Payload("form", fields=(("to", "a"), ("to", "b"), ("x", "1")))
    assert canonical(form) == canonical(
        Payload("form", fields=(("x", "1"), ("to", "a"), ("to", "b")))
    )
    assert canonical(form) != canonical(
        Payload("form", fields=(("to", "b"), ("to", "a"), ("x", "1")))
    )
    # Respelling keeps the meaning: what the replay properties rely on.
    style = Style(0, False, False, "exponent", True, "x")
    respelt = dataclasses.replace(style, seed=7, spaced=True, numbers="float", boundary="y")
    assert json.loads(encode(json_body, respelt, None)[1]) == json.loads(
        encode(json_body, style, None)[1]
    )
    for seed in range(20):
        spelt = encode(form, dataclasses.replace(style, seed=seed), None)[1].decode()
        assert [value for name, value in parse_qsl(spelt) if name == "to"] == ["a", "b"]
