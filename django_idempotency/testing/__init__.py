"""Test helpers for projects: assert in one line that an endpoint is idempotent, and crash it at
named points to prove it runs once."""

from __future__ import annotations

import collections
import contextlib
import json
import uuid
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.core.serializers.json import DjangoJSONEncoder
from django.test.client import BOUNDARY, MULTIPART_CONTENT, encode_multipart

from django_idempotency import signals
from django_idempotency.conf import conf
from django_idempotency.core.fingerprint import is_json_media_type
from django_idempotency.core.keys import new_key
from django_idempotency.http.requests import SAFE_METHODS
from django_idempotency.http.responses import REPLAYED_HEADER
from django_idempotency.testing.crash_points import (
    POINTS,
    CrashPoint,
    crash_at,
    crash_environment,
)

if TYPE_CHECKING:
    from django.test import Client
    from django.test.client import _MonkeyPatchedWSGIResponse as TestResponse

__all__ = [
    "POINTS",
    "CrashPoint",
    "IdempotencyAssertionsMixin",
    "assert_idempotent",
    "crash_at",
    "crash_environment",
]


def assert_idempotent(
    client: Client,
    method: str,
    path: str,
    data: Any = None,
    *,
    content_type: str = "application/json",
    headers: Mapping[str, str] | None = None,
    key: str | None = None,
    header: str | None = None,
) -> tuple[TestResponse, TestResponse]:
    """Send one request twice with the same fresh key; fail unless the retry was a replay.

    The retry must get the same status and body, carry ``Idempotent-Replayed: true``, and the
    view must have run once (one claim on the key). Works with Django's test ``Client`` and
    DRF's ``APIClient``. ``data`` is encoded for ``content_type`` (JSON, form or multipart) unless
    it is already ``str`` or ``bytes``; ``header`` is the key's header when the view uses another
    one than IDEMPOTENCY_HEADER. Returns both responses for further checks.
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not this function's.
    method = method.upper()
    if method in SAFE_METHODS:
        raise ValueError(
            f"{method} requests are never guarded; assert_idempotent needs an unsafe method "
            "such as POST, PUT, PATCH or DELETE."
        )
    key = key or _fresh_key()
    body, content_type = _encode(data, content_type)
    sent = {**(headers or {}), header or conf.HEADER: key}

    with _outcomes_of(key) as seen:
        first = client.generic(method, path, body, content_type, headers=sent)
        first_seen = seen.copy()
        second = client.generic(method, path, body, content_type, headers=sent)

    problems = _compare(first, second, first_seen, seen)
    if problems:
        outcomes = ", ".join(f"{name} x{count}" for name, count in seen.items()) or "none"
        raise AssertionError(
            f"{method} {path} with key {key!r} is not idempotent:\n"
            + "\n".join(f"- {problem}" for problem in problems)
            + f"\n(outcomes signalled for the key: {outcomes})"
        )
    return first, second


class IdempotencyAssertionsMixin:
    """For ``django.test.TestCase`` (or DRF's ``APITestCase``): ``self.assertIdempotent(...)``."""

    client: Client

    def assertIdempotent(  # Named like unittest's own assertions.
        self,
        method: str,
        path: str,
        data: Any = None,
        *,
        client: Client | None = None,
        **options: Any,
    ) -> tuple[TestResponse, TestResponse]:
        """`assert_idempotent` with ``self.client``, or the ``client`` given."""
        return assert_idempotent(client or self.client, method, path, data, **options)


def _fresh_key() -> str:
    # A ULID passes every IDEMPOTENCY_KEY_FORMAT but "uuid"; a UUID passes that one and None.
    return new_key() if conf.KEY_FORMAT in ("ulid", "uuid_or_ulid") else str(uuid.uuid4())


def _encode(data: Any, content_type: str) -> tuple[bytes | str, str]:
    """The body both test clients send as is (DRF's would otherwise str() a dict)."""
    if data is None:
        return b"", content_type
    if isinstance(data, (bytes, str)):
        return data, content_type
    media_type = content_type.partition(";")[0].strip().lower()
    if is_json_media_type(media_type):
        return json.dumps(data, cls=DjangoJSONEncoder), content_type
    if media_type == "application/x-www-form-urlencoded":
        return urlencode(data, doseq=True), content_type
    if media_type == "multipart/form-data":
        return encode_multipart(BOUNDARY, data), MULTIPART_CONTENT
    raise TypeError(
        f"Cannot encode {type(data).__name__} as {content_type}; pass the body as bytes or str."
    )


@contextlib.contextmanager
def _outcomes_of(key: str) -> Iterator[collections.Counter[str]]:
    """Count the signals sent for `key` (in any namespace, for any owner) while the block runs."""
    seen: collections.Counter[str] = collections.Counter()
    receivers = []
    for outcome, signal in signals.BY_OUTCOME.items():

        def receive(sender: Any, *, outcome: str = outcome, **kwargs: Any) -> None:
            if kwargs.get("key") == key:
                seen[outcome] += 1

        signal.connect(receive, weak=False)
        receivers.append((signal, receive))
    try:
        yield seen
    finally:
        for signal, receive in receivers:
            signal.disconnect(receive)


def _compare(
    first: TestResponse,
    second: TestResponse,
    first_seen: collections.Counter[str],
    seen: collections.Counter[str],
) -> list[str]:
    problems = []
    if first_seen["replayed"]:
        problems.append(
            "the first request was already a replay: the key was used before; pass a fresh key "
            "(or none, and one is made up)"
        )
    if first.status_code != second.status_code:
        problems.append(f"status differs: first {first.status_code}, retry {second.status_code}")
    first_body, second_body = _body(first), _body(second)
    if first_body != second_body:
        problems.append(
            f"body differs: first {_shorten(first_body)}, retry {_shorten(second_body)}"
        )
    replayed = second.headers.get(REPLAYED_HEADER)
    if replayed != "true":
        found = "none" if replayed is None else repr(replayed)
        problems.append(f"the retry lacks `{REPLAYED_HEADER}: true` (it has {found})")
    runs = seen["claimed"]
    if runs == 0 and seen["mismatch"]:
        problems.append(
            "the key was refused as a mismatch: it was used before for a different request; "
            "pass a fresh key"
        )
    elif runs == 0 and seen["conflict"]:
        problems.append("the key was refused as in progress: another request holds it")
    elif runs == 0 and not first_seen["replayed"]:
        problems.append(
            "the key was never claimed, so the view ran on each request: the endpoint is not "
            "guarded for this method (no @idempotent or IdempotencyMixin, the key in another "
            "header, or IDEMPOTENCY_ENABLED = False)"
        )
    elif runs > 1:
        reason = ""
        if first_seen["released"]:
            reason = (
                f": the first response ({first.status_code}) was not stored, so the key was "
                "released and the retry ran the view again (see the storage policy)"
            )
        problems.append(f"the view ran {runs} times for one key, expected once{reason}")
    return problems


def _body(response: TestResponse) -> bytes:
    if response.streaming:
        return b"".join(response.streaming_content)  # type: ignore[attr-defined]
    return response.content


def _shorten(body: bytes, limit: int = 200) -> str:
    text = repr(body)
    return text if len(text) <= limit else text[: limit - 3] + "..."
