"""Scenario 6: users and tenants never see each other's responses; replays set no cookies and
pass the same permission checks as the first request."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from http.cookies import SimpleCookie

import pytest

from tests.reliability.client import Answer, basic, post, send
from tests.reliability.harness import PASSWORD, Database, Figure, Figures, Serve, Server

PAYMENTS = "/api/payments/"
BODY = {"amount": 500, "currency": "EUR"}


def as_user(name: str) -> list[tuple[str, str]]:
    return [basic(name, PASSWORD)]


def _cookies(answer: Answer) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    for value in answer.all("Set-Cookie"):
        jar.load(value)
    return {name: morsel.value for name, morsel in jar.items()}


def session_login(server: Server, username: str) -> list[tuple[str, str]]:
    """Log in through the admin's form; the headers of a session-authenticated DRF request."""
    form = send(server.url, "GET", "/admin/login/")
    csrf = _cookies(form)["csrftoken"]
    token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', form.body)
    assert token is not None, form
    login = send(
        server.url,
        "POST",
        "/admin/login/",
        f"username={username}&password={PASSWORD}&csrfmiddlewaretoken="
        f"{token.group(1).decode()}&next=/admin/".encode(),
        [("Content-Type", "application/x-www-form-urlencoded"), ("Cookie", f"csrftoken={csrf}")],
    )
    session = _cookies(login).get("sessionid")
    assert login.status == 302 and session, login
    return [("Cookie", f"sessionid={session}; csrftoken={csrf}"), ("X-CSRFToken", csrf)]


class Log:
    """Every answer a test got, for its figures."""

    def __init__(self) -> None:
        self.answers: list[Answer] = []

    def __call__(self, answer: Answer) -> Answer:
        self.answers.append(answer)
        return answer

    def figure(self, variant: str, executions: str, seconds: float, notes: str = "") -> Figure:
        return Figure(
            "6. isolation",
            variant,
            requests=len(self.answers),
            absorbed=sum(a.replayed for a in self.answers),
            executions=executions,
            server_errors=sum(a.status >= 500 for a in self.answers),
            seconds=seconds,
            notes=notes,
        )


def test_user_b_sending_user_a_s_key_never_receives_a_s_response(
    server: Server, db: Database, figures: Figures, timer: Callable[[], float]
) -> None:
    key, log = "isolation-users", Log()
    body = {**BODY, "description": key}

    alice = log(post(server.url, PAYMENTS, body, key, as_user("alice")))
    bob = log(post(server.url, PAYMENTS, body, key, as_user("bob")))
    anonymous = log(post(server.url, PAYMENTS, body, key))
    assert {(a.status, a.replayed) for a in (alice, bob, anonymous)} == {(201, False)}
    assert len({a.json()["id"] for a in (alice, bob, anonymous)}) == 3

    # Each owner's retry replays that owner's response, whatever the credentials carry it.
    session = session_login(server, "alice")
    for headers, first in [(as_user("alice"), alice), (session, alice), (as_user("bob"), bob)]:
        retry = log(post(server.url, PAYMENTS, body, key, headers))
        assert (retry.status, retry.replayed, retry.body) == (201, True, first.body)
    assert log(post(server.url, PAYMENTS, body, key)).body == anonymous.body
    # Another body under the same key is answered from bob's own record: 422, never alice's.
    other = log(post(server.url, PAYMENTS, {**body, "amount": 1}, key, as_user("bob")))
    assert other.problem()["type"].endswith("key-reused")
    assert alice.body not in other.body

    assert db.executions(key) == {key: 3}
    figures.add(log.figure("one key from alice, bob, anonymous", "1 per owner", timer()))


def test_a_replay_never_carries_set_cookie(
    server: Server, db: Database, figures: Figures, timer: Callable[[], float]
) -> None:
    key, log = "isolation-cookies", Log()
    form = f"amount=300&currency=USD&description={key}".encode()
    headers = [("Content-Type", "application/x-www-form-urlencoded")]

    first = log(post(server.url, "/checkout/", form, key, headers))
    retry = log(post(server.url, "/checkout/", form, key, headers))

    assert first.status == retry.status == 303
    assert "preferred_currency" in _cookies(first)  # The view set a cookie...
    assert retry.all("Set-Cookie") == []  # ...which its replay does not hand out again.
    assert retry.replayed and retry.header("Location") == first.header("Location")
    assert db.executions(key) == {key: 1}
    figures.add(log.figure("checkout form with Set-Cookie, replayed", "1", timer()))


def test_a_replay_passes_a_permission_check_revoked_since_the_first_request(
    server: Server, db: Database, figures: Figures, timer: Callable[[], float]
) -> None:
    key, log, path = "isolation-permission", Log(), "/api/staff/payments/"
    body = {**BODY, "description": key}

    first = log(post(server.url, path, body, key, as_user("alice")))
    assert (first.status, first.replayed) == (201, False), first
    db.rows("UPDATE auth_user SET is_staff = false WHERE username = 'alice'")
    try:
        refused = log(post(server.url, path, body, key, as_user("alice")))
    finally:
        db.rows("UPDATE auth_user SET is_staff = true WHERE username = 'alice'")
    again = log(post(server.url, path, body, key, as_user("alice")))

    assert (refused.status, refused.replayed) == (403, False), refused
    assert first.body not in refused.body
    # The record was left alone: once the permission is back, the retry replays it.
    assert (again.status, again.replayed, again.body) == (201, True, first.body)
    assert db.executions(key) == {key: 1}
    figures.add(log.figure("staff permission revoked between request and retry", "1", timer()))


@pytest.fixture(scope="module")
def tenant_server(serve: Serve) -> Iterator[Server]:
    resolver = "testproject.payments.owners.tenant_owner"
    with serve("tenants", IDEMPOTENCY_OWNER_RESOLVER=resolver) as running:
        yield running


def test_tenants_share_their_keys_and_nobody_else_can_reach_them(
    tenant_server: Server, db: Database, figures: Figures, timer: Callable[[], float]
) -> None:
    server, key, log = tenant_server, "isolation-tenants", Log()
    body = {**BODY, "description": key}
    acme, globex = [("X-Tenant", "acme")], [("X-Tenant", "globex")]

    alice = log(post(server.url, PAYMENTS, body, key, [*as_user("alice"), *acme]))
    carol = log(post(server.url, PAYMENTS, body, key, [*as_user("carol"), *acme]))
    # Not members of acme: each request names it, and each stays in its own scope.
    outsiders = [
        log(post(server.url, PAYMENTS, body, key, [*as_user("bob"), *acme])),
        log(post(server.url, PAYMENTS, body, key, acme)),
    ]
    bob_globex = log(post(server.url, PAYMENTS, body, key, [*as_user("bob"), *globex]))
    alice_alone = log(post(server.url, PAYMENTS, body, key, as_user("alice")))

    assert (alice.status, alice.replayed) == (201, False), alice
    assert (carol.status, carol.replayed, carol.body) == (201, True, alice.body)  # Shared.
    for answer in [*outsiders, bob_globex, alice_alone]:
        assert (answer.status, answer.replayed) == (201, False), answer
        assert answer.body != alice.body
    assert db.executions(key) == {key: 5}
    figures.add(
        log.figure(
            "tenant resolver (X-Tenant), members and outsiders",
            "1 per scope",
            timer(),
            notes="scopes: tenant acme (alice, carol), bob, anonymous, tenant globex, alice",
        )
    )
