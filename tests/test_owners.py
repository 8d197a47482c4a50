"""The owner comes from each framework's authentication: two tenants never share a response."""

from __future__ import annotations

import hashlib
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any
from uuid import UUID

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import AnonymousUser, Group
from django.http import HttpRequest
from django.test import Client
from django.test.testcases import LiveServerThread
from django.urls import path
from ninja import NinjaAPI, Schema
from ninja.security import APIKeyHeader, django_auth
from ninja.testing import TestClient
from rest_framework.authentication import BaseAuthentication, SessionAuthentication
from rest_framework.authtoken.models import Token
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import idempotency_exempt
from django_idempotency.contrib.ninja import idempotent
from django_idempotency.contrib.ninja.operations import _path_view_of
from django_idempotency.contrib.rest_framework import IdempotencyMixin
from django_idempotency.http.owners import OwnerUnknown, authenticated_user, identify
from django_idempotency.models import IdempotencyRecord
from tests.factories import UserFactory
from tests.models import Charge
from tests.utils import assert_problem

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]

MIDDLEWARE = "django_idempotency.middleware.IdempotencyMiddleware"


@dataclass
class Tenant:
    """A client of the API: the credential it sends, and the card its charges reveal."""

    name: str
    credential: str
    card: str


@pytest.fixture
def tenants() -> tuple[Tenant, Tenant]:
    """Two tenants, each a user with a DRF token and a group named by that token."""
    made = []
    for name, card in (("acme", "4242 4242 4242 4242"), ("globex", "5555 5555 5555 4444")):
        user = UserFactory(username=name)
        token = Token.objects.create(user=user)
        Group.objects.create(name=token.key)
        made.append(Tenant(name, token.key, card))
    return made[0], made[1]


def card_of(credential: str) -> str:
    """What a charge answers with: the card of whoever presented the credential."""
    username = Token.objects.get(key=credential).user.username
    return {"acme": "4242 4242 4242 4242", "globex": "5555 5555 5555 4444"}[username]


# Ninja operations behind `auth=`, each returning another kind of principal for one credential.

AUTHENTICATED_AS: dict[str, Callable[[str], Any]] = {
    "string": lambda key: key,  # Ninja's own examples return the key itself.
    "model": lambda key: Group.objects.get(name=key),  # A tenant model with an integer pk.
    "token": lambda key: Token.objects.get(key=key),  # A model whose pk is the credential.
    "user": lambda key: Token.objects.get(key=key).user,
    "flag": lambda key: True,  # Authenticated, but by nothing that tells clients apart.
}


class ApiKey(APIKeyHeader):
    param_name = "X-Api-Key"

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def authenticate(self, request: HttpRequest, key: str | None) -> Any:
        if key is None or not Token.objects.filter(key=key).exists():
            return None
        return AUTHENTICATED_AS[self.kind](key)


class ChargeIn(Schema):
    amount: int


api = NinjaAPI(urls_namespace="owners")


def ninja_charge(request: HttpRequest, payload: ChargeIn) -> dict[str, Any]:
    credential = request.headers.get("X-Api-Key", "")
    charge = Charge.objects.create(reference=credential, amount=payload.amount)
    return {"charge": charge.pk, "card": card_of(credential) if credential else ""}


def _operation(kind: str) -> Callable[..., dict[str, Any]]:
    # A function per operation: Ninja keeps one operation per function.
    def charge(request: HttpRequest, payload: ChargeIn) -> dict[str, Any]:
        return ninja_charge(request, payload)

    charge.__name__ = f"charge_{kind}"
    return charge


for _kind in AUTHENTICATED_AS:
    api.post(f"/{_kind}/charges", auth=ApiKey(_kind))(
        idempotent(namespace=f"ninja-{_kind}")(_operation(_kind))
    )

open_api = NinjaAPI(urls_namespace="owners-open")


@open_api.post("/charges")
@idempotent(namespace="ninja-open")
def open_charge(request: HttpRequest, payload: ChargeIn) -> dict[str, Any]:
    """No `auth=`: nobody is authenticated, as on any view that requires no login."""
    return ninja_charge(request, payload)


# Operations written without the guard, for IdempotencyMiddleware to guard.


@api.post("/plain/charges", auth=ApiKey("string"))
def plain_charge(request: HttpRequest, payload: ChargeIn) -> dict[str, Any]:
    return ninja_charge(request, payload)


@api.post("/plain-async/charges", auth=ApiKey("string"))
async def plain_charge_async(request: HttpRequest, payload: ChargeIn) -> dict[str, Any]:
    return await sync_to_async(ninja_charge)(request, payload)


@api.post("/exempt/charges", auth=ApiKey("string"))
@idempotency_exempt
def exempt_charge(request: HttpRequest, payload: ChargeIn) -> dict[str, Any]:
    return ninja_charge(request, payload)


@api.post("/session/charges", auth=django_auth)
@idempotent(namespace="ninja-session")
def session_charge(request: HttpRequest, payload: ChargeIn) -> dict[str, Any]:
    return {"for": request.auth.username}  # type: ignore[attr-defined]


@api.post("/flag-async/charges", auth=ApiKey("flag"))
@idempotent(namespace="ninja-flag-async")
async def flag_charge_async(request: HttpRequest, payload: ChargeIn) -> dict[str, Any]:
    return await sync_to_async(ninja_charge)(request, payload)


urlpatterns = [path("ninja/", api.urls), path("open/", open_api.urls)]


def charge_as(tenant: Tenant, kind: str, client: Client | None = None, key: str = "k-1") -> Any:
    return (client or Client()).post(
        f"/ninja/{kind}/charges",
        json.dumps({"amount": 10}),
        content_type="application/json",
        headers={"Idempotency-Key": key, "X-Api-Key": tenant.credential},
    )


def owners(namespace: str) -> list[str]:
    return sorted(
        IdempotencyRecord.objects.filter(namespace=namespace).values_list("owner", flat=True)
    )


@pytest.mark.parametrize("kind", ["string", "model", "token", "user"])
def test_two_ninja_tenants_with_one_key_each_get_their_own_response(
    tenants: tuple[Tenant, Tenant], kind: str
) -> None:
    acme, globex = tenants

    for_acme = charge_as(acme, kind)
    for_globex = charge_as(globex, kind)
    acme_again = charge_as(acme, kind)

    assert for_globex.status_code == 200
    assert "Idempotent-Replayed" not in for_globex
    assert for_globex.json()["card"] == globex.card  # Never acme's card.
    assert acme_again["Idempotent-Replayed"] == "true"
    assert acme_again.content == for_acme.content
    assert Charge.objects.count() == 2
    assert len(set(owners(f"ninja-{kind}"))) == 2


def test_a_ninja_auth_that_returns_true_is_refused_rather_than_shared(
    tenants: tuple[Tenant, Tenant], caplog: pytest.LogCaptureFixture
) -> None:
    acme, globex = tenants

    with caplog.at_level(logging.ERROR, logger="django_idempotency"):
        for_acme = charge_as(acme, "flag")
        for_globex = charge_as(globex, "flag")

    for answer in (for_acme, for_globex):
        problem = assert_problem(answer, 500, "owner-unknown")
        assert "IDEMPOTENCY_OWNER_RESOLVER" in problem["detail"]
    assert Charge.objects.count() == 0  # Not run: run unscoped, one client's replay is another's.
    assert "Request owner unknown: Django Ninja's auth= gave request.auth a bool" in caplog.text
    assert acme.credential not in caplog.text


@pytest.mark.django_db(transaction=True)
def test_an_async_ninja_operation_refuses_an_auth_that_returns_true_too(
    tenants: tuple[Tenant, Tenant],
) -> None:
    acme, _ = tenants

    assert_problem(charge_as(acme, "flag-async"), 500, "owner-unknown")
    assert Charge.objects.count() == 0


def test_ninja_session_auth_is_the_signed_in_users_primary_key() -> None:
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    answers = []
    for user in (alice, bob):
        browser = Client()
        browser.force_login(user)
        answers.append(
            browser.post(
                "/ninja/session/charges",
                {"amount": 1},
                content_type="application/json",
                headers={"Idempotency-Key": "same"},
            )
        )

    assert [answer.json()["for"] for answer in answers] == ["alice", "bob"]
    assert owners("ninja-session") == sorted([str(alice.pk), str(bob.pk)])


def test_a_ninja_auth_that_returns_true_is_scoped_by_the_signed_in_user(
    tenants: tuple[Tenant, Tenant],
) -> None:
    """`auth=` checked the request (`lambda request: request.user.is_staff`, say): the user
    Django signed in is who sent it."""
    acme, globex = tenants
    as_acme, as_globex = Client(), Client()
    as_acme.force_login(Token.objects.get(key=acme.credential).user)
    as_globex.force_login(Token.objects.get(key=globex.credential).user)

    charge_as(acme, "flag", as_acme)
    for_globex = charge_as(globex, "flag", as_globex)

    assert for_globex.status_code == 200
    assert for_globex.json()["card"] == globex.card
    assert Charge.objects.count() == 2


def test_what_ninjas_auth_returned_wins_over_the_session_beside_it(
    tenants: tuple[Tenant, Tenant],
) -> None:
    """A signed-in browser presenting two API keys sends as two clients, not as one user."""
    acme, globex = tenants
    browser = Client()
    browser.force_login(UserFactory(username="operator"))

    charge_as(acme, "string", browser)
    for_globex = charge_as(globex, "string", browser)

    assert "Idempotent-Replayed" not in for_globex
    assert for_globex.json()["card"] == globex.card
    assert owners("ninja-string") == sorted(identify(t.credential) for t in tenants)


def test_ninja_users_keep_the_owner_their_records_have_had(tenants: tuple[Tenant, Tenant]) -> None:
    """A user is the user's primary key, as under `request.user`: records stored before
    Ninja's `auth=` was read still match their retries."""
    acme, globex = tenants

    charge_as(acme, "user")
    charge_as(globex, "user")

    assert owners("ninja-user") == sorted(
        str(Token.objects.get(key=tenant.credential).user_id) for tenant in tenants
    )


def test_no_owner_holds_the_credential_it_was_derived_from(
    tenants: tuple[Tenant, Tenant], caplog: pytest.LogCaptureFixture
) -> None:
    credentials = [tenant.credential for tenant in tenants]

    with caplog.at_level(logging.DEBUG):
        for kind in ("string", "model", "token"):
            for tenant in tenants:
                charge_as(tenant, kind)

    stored = list(IdempotencyRecord.objects.values_list("owner", flat=True))
    assert len(set(stored)) == 6  # Two tenants, three kinds of principal: six owners.
    assert not [owner for owner in stored for credential in credentials if credential in owner]
    assert not [credential for credential in credentials if credential in caplog.text]


def test_anonymous_clients_of_an_operation_without_auth_share_the_empty_owner() -> None:
    """What the docs promise for anonymous requests, unchanged: one owner, ""."""

    def send() -> Any:
        return Client().post(
            "/open/charges",
            {"amount": 3},
            content_type="application/json",
            headers={"Idempotency-Key": "anon"},
        )

    send()
    second = send()

    assert second["Idempotent-Replayed"] == "true"
    assert owners("ninja-open") == [""]


def test_ninjas_test_client_scopes_by_what_auth_returned(tenants: tuple[Tenant, Tenant]) -> None:
    acme, globex = tenants
    client = TestClient(api)

    def send(tenant: Tenant) -> Any:
        headers = {"Idempotency-Key": "tc-1", "X-Api-Key": tenant.credential}
        return client.post("/string/charges", json={"amount": 1}, headers=headers)

    send(acme)
    for_globex = send(globex)

    assert not for_globex.has_header("Idempotent-Replayed")
    assert for_globex.json()["card"] == globex.card


# Ninja operations behind IdempotencyMiddleware as well: guarded once, after Ninja's auth.


@pytest.mark.parametrize("kind", ["string", "model"])
def test_behind_the_middleware_a_ninja_operation_is_still_scoped_by_its_auth(
    tenants: tuple[Tenant, Tenant], kind: str, settings: Any
) -> None:
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE]
    acme, globex = tenants

    for_acme = charge_as(acme, kind)
    for_globex = charge_as(globex, kind)
    unauthenticated = Client().post(
        f"/ninja/{kind}/charges",
        json.dumps({"amount": 10}),
        content_type="application/json",
        headers={"Idempotency-Key": "k-1"},
    )

    assert for_acme.status_code == for_globex.status_code == 200
    assert for_globex.json()["card"] == globex.card
    assert unauthenticated.status_code == 401  # Never a replay before Ninja's auth.
    assert Charge.objects.count() == 2
    assert IdempotencyRecord.objects.count() == 2


@pytest.mark.django_db(transaction=True)  # The async operation writes on another thread.
@pytest.mark.parametrize("kind", ["plain", "plain-async"])
def test_the_middleware_guards_an_undecorated_ninja_operation_after_its_auth(
    tenants: tuple[Tenant, Tenant], kind: str, settings: Any
) -> None:
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE]
    acme, globex = tenants

    for_acme = charge_as(acme, kind)
    acme_again = charge_as(acme, kind)
    for_globex = charge_as(globex, kind)
    unauthenticated = Client().post(
        f"/ninja/{kind}/charges",
        json.dumps({"amount": 10}),
        content_type="application/json",
        headers={"Idempotency-Key": "k-1"},
    )

    assert acme_again["Idempotent-Replayed"] == "true"
    assert acme_again.content == for_acme.content
    assert "Idempotent-Replayed" not in for_globex
    assert for_globex.json()["card"] == globex.card
    assert unauthenticated.status_code == 401
    assert Charge.objects.count() == 2
    assert len(set(owners("default"))) == 2


def test_the_middleware_leaves_an_exempt_ninja_operation_alone(
    tenants: tuple[Tenant, Tenant], settings: Any
) -> None:
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE]
    acme, _ = tenants

    charge_as(acme, "exempt")
    again = charge_as(acme, "exempt")

    assert "Idempotent-Replayed" not in again
    assert Charge.objects.count() == 2
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.django_db(transaction=True)  # The async operation writes on another thread.
@pytest.mark.parametrize("kind", ["plain", "plain-async"])
def test_without_the_middleware_an_undecorated_ninja_operation_is_not_guarded(
    tenants: tuple[Tenant, Tenant], kind: str, settings: Any
) -> None:
    """The middleware's guard on an operation acts only for the requests it hands over."""
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE]
    acme, _ = tenants
    charge_as(acme, kind, key="behind")  # The operation now carries the middleware's guard.
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != MIDDLEWARE]

    first = charge_as(acme, kind, key="alone")
    second = charge_as(acme, kind, key="alone")

    assert "Idempotent-Replayed" not in second
    assert second.json()["charge"] != first.json()["charge"]
    assert IdempotencyRecord.objects.count() == 1


# DRF: an authentication class that sets `request.auth` and no user (an API key, a client).


class ApiKeyAuthentication(BaseAuthentication):
    def __init__(self, kind: str) -> None:
        self.kind = kind

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        key = request.headers.get("X-Api-Key")
        if key is None or not Token.objects.filter(key=key).exists():
            return None
        return AnonymousUser(), AUTHENTICATED_AS[self.kind](key)


class DrfCharges(IdempotencyMixin, APIView):
    kind = ""

    def get_authenticators(self) -> list[BaseAuthentication]:
        return [ApiKeyAuthentication(self.kind)]

    def post(self, request: Request) -> Response:
        credential = request.headers["X-Api-Key"]
        charge = Charge.objects.create(reference=credential, amount=request.data["amount"])
        return Response({"charge": charge.pk, "card": card_of(credential)}, status=201)


urlpatterns += [
    path(f"drf/{kind}/charges", type(f"Drf{kind}", (DrfCharges,), {"kind": kind}).as_view())
    for kind in AUTHENTICATED_AS
]


def drf_charge_as(tenant: Tenant, kind: str) -> Any:
    return Client().post(
        f"/drf/{kind}/charges",
        {"amount": 10},
        content_type="application/json",
        headers={"Idempotency-Key": "k-1", "X-Api-Key": tenant.credential},
    )


@pytest.mark.parametrize("kind", ["string", "model", "token"])
def test_two_drf_clients_known_only_by_request_auth_each_get_their_own_response(
    tenants: tuple[Tenant, Tenant], kind: str
) -> None:
    acme, globex = tenants

    drf_charge_as(acme, kind)
    for_globex = drf_charge_as(globex, kind)
    acme_again = drf_charge_as(acme, kind)

    assert for_globex.status_code == 201
    assert "Idempotent-Replayed" not in for_globex
    assert for_globex.json()["card"] == globex.card
    assert acme_again["Idempotent-Replayed"] == "true"
    assert Charge.objects.count() == 2
    assert not [o for o in owners("default") for t in tenants if t.credential in o]


def test_a_drf_request_auth_that_tells_no_client_apart_is_refused(
    tenants: tuple[Tenant, Tenant], caplog: pytest.LogCaptureFixture
) -> None:
    acme, _ = tenants

    with caplog.at_level(logging.ERROR, logger="django_idempotency"):
        assert_problem(drf_charge_as(acme, "flag"), 500, "owner-unknown")

    assert Charge.objects.count() == 0
    assert "DRF's authentication gave request.auth a bool" in caplog.text
    assert acme.credential not in caplog.text


# A DRF authentication that returns a model other than the user model as the user.


class ClientAsUser(BaseAuthentication):
    """An API client (here a group) authenticated as DRF's user, as machine clients often are."""

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        name = request.headers.get("X-Client")
        group = Group.objects.filter(name=name).first() if name else None
        if group is None:
            return None
        group.is_authenticated = True  # type: ignore[attr-defined]
        return group, None


class SessionOrClientCharges(IdempotencyMixin, APIView):
    authentication_classes = [SessionAuthentication, ClientAsUser]

    def post(self, request: Request) -> Response:
        charge = Charge.objects.create(reference=str(request.user), amount=1)
        return Response({"charge": charge.pk, "for": str(request.user)}, status=201)


urlpatterns += [path("drf/session-or-client/charges", SessionOrClientCharges.as_view())]


def test_a_client_model_as_drf_user_never_shares_an_owner_with_the_user_of_its_pk() -> None:
    user = UserFactory(username="someone")
    Group.objects.create(pk=user.pk, name="client")
    as_user = Client(enforce_csrf_checks=False)
    as_user.force_login(user)

    def send(client: Client, **headers: str) -> Any:
        return client.post(
            "/drf/session-or-client/charges",
            {},
            content_type="application/json",
            headers={"Idempotency-Key": "same", **headers},
        )

    for_user = send(as_user)
    for_client = send(Client(), **{"X-Client": "client"})

    assert for_user.json()["for"] == "someone"
    assert for_client.status_code == 201
    assert for_client.json()["for"] == "client"
    assert sorted(owners("default")) == sorted([str(user.pk), f"auth.group:{user.pk}"])


# What identifies each kind of principal.


@pytest.mark.parametrize(
    ("principal", "owner"),
    [
        (b"raw", "sha256:" + hashlib.sha256(b"raw").hexdigest()),
        ("raw", "sha256:" + hashlib.sha256(b"raw").hexdigest()),
        (7, "sha256:" + hashlib.sha256(b"7").hexdigest()),
        (
            UUID(int=1),
            "sha256:" + hashlib.sha256(str(UUID(int=1)).encode()).hexdigest(),
        ),
        # A lone surrogate, as JSON may decode one into a claim `auth=` returns.
        ("\ud800", "sha256:" + hashlib.sha256(b"\xed\xa0\x80").hexdigest()),
        (AnonymousUser(), ""),
        # A user that is no model (a JWT's stateless user): its primary key, as a user's.
        (SimpleNamespace(is_authenticated=True, pk=5), "5"),
        (SimpleNamespace(is_authenticated=True, pk=None), None),
        (True, None),
        (False, None),
        (None, None),
        ({"sub": "acme"}, None),  # Claims change with every token: nothing stable to scope by.
        (object(), None),
        (Group(name="unsaved"), None),
    ],
)
def test_identify(principal: Any, owner: str | None) -> None:
    assert identify(principal) == owner


def test_without_a_user_model_every_model_is_named_by_its_model(settings: Any) -> None:
    group = Group.objects.create(name="g")
    settings.AUTH_USER_MODEL = "missing.User"

    assert identify(group) == f"auth.group:{group.pk}"


def test_the_middleware_leaves_a_method_ninja_does_not_serve_to_ninja(
    tenants: tuple[Tenant, Tenant], settings: Any
) -> None:
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE]
    acme, _ = tenants

    answer = Client().put(
        "/ninja/plain/charges",
        "{}",
        content_type="application/json",
        headers={"Idempotency-Key": "k", "X-Api-Key": acme.credential},
    )

    assert answer.status_code == 405
    assert not IdempotencyRecord.objects.exists()


def test_a_ninja_view_that_is_its_path_views_bound_method_is_found() -> None:
    """Ninja before 1.4 routed to the PathView's bound method rather than a closure."""
    [pattern] = [p for p in api.urls[0] if str(p.pattern) == "plain/charges"]
    path_view = _path_view_of(pattern.callback)

    assert path_view is not None
    assert _path_view_of(path_view._sync_view) is path_view
    assert _path_view_of(ninja_charge) is None


def test_a_resolver_may_refuse_an_unknown_owner_itself(settings: Any) -> None:
    settings.IDEMPOTENCY_OWNER_RESOLVER = f"{__name__}.refusing_resolver"

    answer = Client().post(
        "/open/charges",
        {"amount": 1},
        content_type="application/json",
        headers={"Idempotency-Key": "k"},
    )

    assert_problem(answer, 500, "owner-unknown")
    assert Charge.objects.count() == 0


def refusing_resolver(request: Any) -> str:
    raise OwnerUnknown("No tenant header, and no user signed in.")


def test_a_plain_django_request_is_its_user() -> None:
    request = HttpRequest()
    request.user = AnonymousUser()
    assert authenticated_user(request) == ""
    request.user = UserFactory()
    assert authenticated_user(request) == str(request.user.pk)


# Over HTTP, through a real server with the middleware, tenants racing with one key.


@pytest.fixture
def served(settings: Any) -> Iterator[str]:
    """This module's URLs served over HTTP by a threaded server built with IdempotencyMiddleware
    (Django's live server builds its middleware once, before a test could add it)."""
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE]
    thread = LiveServerThread("127.0.0.1", lambda handler: handler)
    thread.daemon = True
    thread.start()
    thread.is_ready.wait()
    if thread.error:
        raise thread.error
    yield f"http://127.0.0.1:{thread.port}"
    thread.terminate()


def send_over_http(url: str, credential: str | None) -> tuple[int, dict[str, str], bytes]:
    headers = {"Content-Type": "application/json", "Idempotency-Key": "live"}
    if credential is not None:
        headers["X-Api-Key"] = credential
    request = urllib.request.Request(url, b'{"amount": 5}', headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["string", "plain", "plain-async"])
def test_two_tenants_racing_with_one_key_through_a_real_server(
    tenants: tuple[Tenant, Tenant], kind: str, served: str
) -> None:
    url = f"{served}/ninja/{kind}/charges"
    acme, globex = tenants
    senders = [acme, globex] * 6
    with ThreadPoolExecutor(max_workers=len(senders)) as pool:
        answers = list(pool.map(lambda t: (t, send_over_http(url, t.credential)), senders))
    nobody = send_over_http(url, None)

    for tenant, (status, _, body) in answers:
        assert status in (200, 409)
        if status == 200:
            assert json.loads(body)["card"] == tenant.card  # Never the other tenant's.
    assert nobody[0] == 401  # Never a replay before Ninja's auth.
    assert sorted(Charge.objects.values_list("reference", flat=True)) == sorted(
        t.credential for t in tenants
    )
    retries = [send_over_http(url, tenant.credential) for tenant in tenants]
    assert [json.loads(body)["card"] for _, _, body in retries] == [t.card for t in tenants]
    assert all(headers["Idempotent-Replayed"] == "true" for _, headers, _ in retries)
