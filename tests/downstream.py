"""A downstream API for the outbound client's tests, served by the live server: scripted answers,
a view guarded by this package, one that answers only when the test lets it. It notes what each
request carried, so that tests count the attempts the server really received.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

from django.contrib import admin
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from django_idempotency import idempotent
from django_idempotency.models import OutboundCall
from tests.models import Charge

KEY_HEADER = "Idempotency-Key"


@dataclass(frozen=True)
class Seen:
    """One request as the downstream received it."""

    method: str
    key: str | None
    step_header: str | None  # The adapter's step header, which must never arrive here.
    body: bytes
    journaled: str | None  # The outcome of the caller's journal row as the request arrived.


@dataclass
class Downstream:
    """What each path was sent, and the answers each scripted path gives next."""

    # A condition, not a bare lock: a test can wait for requests its client gave up on to arrive.
    lock: threading.Condition = field(default_factory=threading.Condition)
    seen: dict[str, list[Seen]] = field(default_factory=lambda: defaultdict(list))
    scripts: dict[str, list[tuple[int, dict[str, str]]]] = field(default_factory=dict)
    # The slow view answers once the test sets it (or after a minute, lest a test hang).
    release: threading.Event = field(default_factory=threading.Event)

    def script(self, name: str, *answers: int | tuple[int, dict[str, str]]) -> str:
        """Answer the next requests to `name` with these statuses (and headers); then 201.
        Returns the path."""
        self.scripts[name] = [a if isinstance(a, tuple) else (a, {}) for a in answers]
        return f"/downstream/scripted/{name}/"

    def note(self, name: str, request: HttpRequest) -> int:
        key = request.headers.get(KEY_HEADER)
        seen = Seen(
            request.method or "",
            key,
            request.headers.get("Idempotency-Step"),
            request.body,
            _journaled(key),
        )
        with self.lock:
            self.seen[name].append(seen)
            self.lock.notify_all()
            return len(self.seen[name])

    def keys(self, name: str) -> list[str | None]:
        return [seen.key for seen in self.seen[name]]

    def arrived(self, name: str, count: int, within: float = 30) -> list[str | None]:
        """The keys of `name`'s requests once `count` have arrived (or `within` seconds passed).

        A client that timed out has sent its request, but the server's thread may note it later
        than the client gives up: on a busy machine it first opens its database connection."""
        with self.lock:
            self.lock.wait_for(lambda: len(self.seen[name]) >= count, timeout=within)
        return self.keys(name)

    def reset(self) -> None:
        with self.lock:
            self.seen.clear()
            self.scripts.clear()
            self.release = threading.Event()


DOWNSTREAM = Downstream()


def _journaled(key: str | None) -> str | None:
    if key is None:
        return None
    try:
        outcomes = OutboundCall.objects.filter(key=key).values_list("outcome", flat=True)
        return outcomes.first()
    except DatabaseError:  # A test that took the database away: it answers all the same.
        return None


@csrf_exempt
def scripted(request: HttpRequest, name: str) -> HttpResponse:
    count = DOWNSTREAM.note(name, request)
    with DOWNSTREAM.lock:
        script = DOWNSTREAM.scripts.get(name) or []
        status, headers = script.pop(0) if script else (201, {})
    return JsonResponse({"name": name, "received": count}, status=status, headers=headers)


@csrf_exempt
@idempotent(mode="lease")
def guarded(request: HttpRequest) -> HttpResponse:
    """A service built with this package: runs once per key, replays to every retry."""
    DOWNSTREAM.note("guarded", request)
    amount = json.loads(request.body or b"{}").get("amount", 1)
    charge = Charge.objects.create(reference="downstream", amount=amount)
    return JsonResponse({"id": charge.pk}, status=201)


@csrf_exempt
def slow(request: HttpRequest) -> HttpResponse:
    """Answers only once the test sets DOWNSTREAM.release: past any client's short timeout."""
    DOWNSTREAM.note("slow", request)
    DOWNSTREAM.release.wait(60)
    return JsonResponse({"late": True}, status=201)


# The caller's side: an operation of this project that calls the downstream.
CRASHES: list[bool] = []  # Each run of `pay` pops one: True crashes it after its call.


@csrf_exempt
@idempotent(mode="lease")
def pay(request: HttpRequest) -> HttpResponse:
    """A guarded view of the caller's: charges through the outbound client, in step "charge",
    then answers the order's "answer" status (201 by default)."""
    import httpx

    from django_idempotency.outbound import IdempotentTransport

    order = json.loads(request.body)
    with httpx.Client(transport=IdempotentTransport(namespace="bank")) as client:
        charged = client.post(
            order["url"],
            json={"amount": order["amount"]},
            extensions={"idempotency_step": "charge"},
        )
    if CRASHES and CRASHES.pop(0):
        raise RuntimeError("The caller crashed after its call.")
    return JsonResponse(charged.json(), status=order.get("answer", 201))


urlpatterns = [
    path("admin/", admin.site.urls),
    path("caller/pay/", pay),
    path("downstream/scripted/<str:name>/", scripted),
    path("downstream/guarded/", guarded),
    path("downstream/slow/", slow),
]


def reset_downstream() -> Iterator[Downstream]:
    """The body of the tests' fixture: a fresh script, and the slow view let go at the end."""
    DOWNSTREAM.reset()
    try:
        yield DOWNSTREAM
    finally:
        DOWNSTREAM.release.set()
