"""Scenario 5: fuzzed keys, headers and bodies, and the OpenAPI schema's operations, over HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
import schemathesis
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.reliability.client import Answer, post, send
from tests.reliability.harness import Database, Figure, Figures, Server, keep_artefact

# The database store's alone (deselected when RELIABILITY_STORE=redis): that no completed record
# is overwritten is read from the database store's table.
pytestmark = pytest.mark.database_store

EXAMPLES = 200
SCHEMA_EXAMPLES = 15  # Per operation of the schema, in each generation mode.
# The key seeded on each guarded endpoint, and the body it was first sent with.
SEEDED = {
    "/api/payments/": {"amount": 4200, "currency": "EUR", "description": "seeded"},
    "/api/bench/lease/": {"amount": 4300, "currency": "EUR", "description": "seeded"},
    "/api/refunds/": None,  # Filled in with the seeded payment's id.
    "/checkout/": b"amount=4400&currency=EUR&description=seeded",
}
SEED_KEY = "hostile-seeded"
FORM = "application/x-www-form-urlencoded"
# Rejections that are the view's own (DRF's or Django's), not the idempotency layer's.
VIEW_REJECTIONS = {400, 404, 405, 406, 415}
LIBRARY_REJECTIONS = {400, 409, 413, 422}


@pytest.fixture(scope="module")
def seeded(server: Server, db: Database) -> Iterator[dict[str, tuple[Any, Answer]]]:
    """Completed records the fuzzing tries to overwrite; their stored rows must never change."""
    bodies = dict(SEEDED)
    answers: dict[str, tuple[Any, Answer]] = {}
    for path, body in bodies.items():
        if path == "/api/refunds/":
            body = {"payment": answers["/api/payments/"][1].json()["id"], "amount": 1}
        headers = [("Content-Type", FORM)] if path == "/checkout/" else []
        answer = post(server.url, path, body, SEED_KEY, headers)
        assert answer.status in (201, 303), answer
        answers[path] = (body, answer)
    before = _completed(db)
    yield answers
    after = _completed(db)
    assert {k: after.get(k) for k in before} == before, "a completed record was overwritten"
    for path, (body, answer) in answers.items():
        headers = [("Content-Type", FORM)] if path == "/checkout/" else []
        replay = post(server.url, path, body, SEED_KEY, headers)
        assert (replay.status, replay.replayed, replay.body) == (answer.status, True, answer.body)


def _completed(db: Database) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    """Completed records that cannot expire during the run: scope -> what is stored."""
    rows = db.rows(
        'SELECT namespace, owner, "key", fingerprint, response_status, response_headers, '
        "response_body, expires_at FROM django_idempotency_record "
        "WHERE status = 'completed' AND expires_at > now() + interval '1' hour"
    )
    return {tuple(row[:3]): tuple(row[3:]) for row in rows}


def check(answer: Answer) -> str:
    """What every answer to hostile input must be; returns its kind for the figures."""
    assert answer.status != 0, answer.error
    assert answer.status < 500, answer
    assert b"Traceback" not in answer.body, answer
    if answer.status < 400:
        return "replay" if answer.replayed else str(answer.status)
    if answer.is_problem:
        assert answer.status in LIBRARY_REJECTIONS, answer
        answer.problem()
        return f"{answer.status} problem"
    assert answer.status in VIEW_REJECTIONS, answer
    return f"{answer.status} view"


# Header values as a server passes them on (RFC 9110 field-value: visible ASCII, space, tab and
# obs-text bytes). Control characters never reach the application: gunicorn refuses them.
_VISIBLE = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
_OBS_TEXT = st.characters(min_codepoint=0x80, max_codepoint=0xFF)
keys = st.one_of(
    st.none(),
    st.just(SEED_KEY),
    st.text(_VISIBLE, max_size=20),
    st.text(_VISIBLE, min_size=250, max_size=300),
    st.text(st.one_of(_VISIBLE, _OBS_TEXT, st.just("\t")), max_size=40),
    st.text(_VISIBLE, max_size=30).map(lambda s: '"' + s + '"'),  # An sf-String, or not quite.
    st.uuids().map(str),
).map(lambda key: None if key is None else key.encode("latin-1"))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
payments = st.fixed_dictionaries(
    {},
    optional={
        "amount": st.one_of(st.integers(-5, 10**12), st.text(max_size=8), st.none()),
        "currency": st.text(max_size=5),
        "description": st.text(max_size=250),
        "payment": st.integers(-2, 10**6),
    },
)
bodies = st.one_of(
    st.just(None),
    st.binary(max_size=512),
    json_values.map(lambda v: json.dumps(v).encode()),
    payments.map(lambda v: json.dumps(v).encode()),
    st.sampled_from(
        [json.dumps(b).encode() for b in SEEDED.values() if isinstance(b, dict)]
        + [SEEDED["/checkout/"]]  # type: ignore[list-item]
    ),
    st.text(max_size=100).map(str.encode),
)
content_types = st.one_of(
    st.none(),
    st.sampled_from(
        [
            "application/json",
            "application/problem+json",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=fuzz",
            "multipart/form-data",
            "text/plain; charset=utf-8",
            "application/json; charset=latin-1",
            "application/octet-stream",
        ]
    ),
    st.text(_VISIBLE, max_size=30),
)
_TOKEN = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789-_!#$%&'*+.^`|~"), min_size=1)
extra_headers = st.lists(
    st.tuples(
        st.one_of(st.sampled_from(["Idempotency-Key", "X-Tenant", "Cookie", "Accept"]), _TOKEN),
        st.text(_VISIBLE, max_size=40),
    ),
    max_size=3,
)
targets = st.sampled_from(
    [
        ("POST", "/api/payments/"),
        ("POST", "/api/payments/"),
        ("POST", "/api/payments/?currency=EUR&x=%00"),
        ("POST", "/api/bench/lease/"),
        ("POST", "/api/refunds/"),
        ("POST", "/checkout/"),
        ("PATCH", "/api/payments/"),  # Not mapped: DRF's 405, whatever the key.
        ("DELETE", "/api/refunds/"),
    ]
)


_VALID_BODIES = {
    "/api/refunds/": st.fixed_dictionaries(
        {"payment": st.integers(1, 5), "amount": st.integers(0, 10**6)}
    ).map(lambda v: json.dumps(v).encode()),
    "/checkout/": st.fixed_dictionaries(
        {"amount": st.integers(0, 10**6), "currency": st.sampled_from(["EUR", "USD"])}
    ).map(lambda v: urlencode(v).encode()),
}
_VALID_PAYMENT = st.fixed_dictionaries(
    {"amount": st.integers(0, 10**6), "currency": st.sampled_from(["EUR", "USD"])},
    optional={"description": st.text(max_size=50)},
).map(lambda v: json.dumps(v).encode())


@st.composite
def hostile_requests(
    draw: st.DrawFn,
) -> tuple[str, str, list[tuple[str, str | bytes]], bytes | None]:
    """Half of them well-formed but for one part (key, body, content type or extra headers)."""
    method, path = draw(targets)
    key, body, content_type = draw(keys), draw(bodies), draw(content_types)
    headers = draw(extra_headers)
    if draw(st.booleans()):
        hostile = draw(st.sampled_from(["nothing", "key", "body", "content type", "headers"]))
        if hostile != "key":
            key = draw(st.uuids()).hex.encode()
        if hostile != "body":
            body = draw(_VALID_BODIES.get(path.split("?")[0], _VALID_PAYMENT))
        if hostile != "content type":
            content_type = FORM if path == "/checkout/" else "application/json"
        if hostile != "headers":
            headers = []
    sent: list[tuple[str, str | bytes]] = []
    if key is not None:
        sent.append(("Idempotency-Key", key))
    if content_type is not None:
        sent.append(("Content-Type", content_type))
    return method, path, [*sent, *headers], body


def test_fuzzed_keys_headers_and_bodies_never_give_a_500_or_overwrite_a_record(
    server: Server, seeded: dict[str, tuple[Any, Answer]], figures: Figures
) -> None:
    tally: Counter[str] = Counter()
    started = time.monotonic()
    # The server's state changes with every request, so hypothesis may fail to replay a failure
    # by itself: the seed reruns the whole sequence (RELIABILITY_SEED=<seed>), and the failing
    # request is in the message, whole, to be sent again by hand.
    run_seed = int(os.environ.get("RELIABILITY_SEED") or random.randrange(2**32))
    print(f"\nhostile input: RELIABILITY_SEED={run_seed}")

    @seed(run_seed)
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(request=hostile_requests())
    def fuzz(request: tuple[str, str, list[tuple[str, str | bytes]], bytes | None]) -> None:
        method, path, headers, body = request
        answer = send(server.url, method, path, body, headers, timeout=30)
        try:
            tally[check(answer)] += 1
            seeded_with = seeded.get(path)
            if (
                answer.replayed
                and seeded_with is not None
                and ("Idempotency-Key", SEED_KEY.encode()) in headers
            ):
                assert (answer.status, answer.body) == (seeded_with[1].status, seeded_with[1].body)
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}\nrequest: {method} {path}\nheaders: {headers!r}\nbody: {body!r}\n"
                f"answer: {answer.status} {answer.headers!r} {answer.body[:2000]!r}\n"
                f"the run's sequence again: RELIABILITY_SEED={run_seed}"
            ) from exc

    try:
        fuzz()
    except BaseException:
        print(f"gunicorn's log of the run: {keep_artefact(server.log)}")
        raise
    figures.add(
        Figure(
            "5. hostile input",
            f"hypothesis: keys, headers, bodies ({EXAMPLES} examples)",
            requests=sum(tally.values()),
            absorbed=sum(
                n for kind, n in tally.items() if kind.endswith("problem") or kind == "replay"
            ),
            executions="-",
            server_errors=0,
            seconds=time.monotonic() - started,
            notes=", ".join(f"{kind}: {n}" for kind, n in sorted(tally.items())),
        )
    )


def test_the_openapi_schemas_operations_never_give_a_500(
    server: Server, seeded: dict[str, tuple[Any, Answer]], figures: Figures
) -> None:
    """schemathesis generates requests, valid and invalid, for each operation of the schema."""
    schema = schemathesis.openapi.from_url(server.url + "/api/schema/?format=json").exclude(
        path_regex="^/api/(provider|staff|schema)/"
    )
    tally: Counter[str] = Counter()
    operations = []
    started = time.monotonic()
    for result in schema.get_all_operations():
        operation = result.ok()
        operations.append(operation.label)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(
                max_examples=SCHEMA_EXAMPLES,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def call(case: Any) -> None:
                response = case.call(base_url=server.url, timeout=30)
                headers = tuple((k, v) for k, values in response.headers.items() for v in values)
                answer = Answer(response.status_code, headers, response.content)
                tally[check(answer)] += 1

            with contextlib.suppress(Unsatisfiable):  # Nothing can be invalid (e.g. a bare GET).
                call()
    assert len(operations) >= 5, operations
    figures.add(
        Figure(
            "5. hostile input",
            f"schemathesis: {len(operations)} operations x 2 modes x <= {SCHEMA_EXAMPLES}",
            requests=sum(tally.values()),
            absorbed=sum(n for kind, n in tally.items() if kind.endswith("problem")),
            executions="-",
            server_errors=0,
            seconds=time.monotonic() - started,
            notes=", ".join(f"{kind}: {n}" for kind, n in sorted(tally.items())),
        )
    )
