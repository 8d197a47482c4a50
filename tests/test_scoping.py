"""Keys belong to (namespace, owner): no client ever receives another's stored response."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client, override_settings

from tests.factories import UserFactory
from tests.models import Charge
from tests.stores import stored
from tests.utils import ViewKind, post

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("store")]


def tenant_owner(request: Any) -> str:
    """A header-based owner resolver, as a multi-tenant project would write one."""
    return "tenant:" + request.headers.get("X-Tenant", "")


def test_user_b_never_receives_user_a_response(view_kind: ViewKind) -> None:
    alice, bob = Client(), Client()
    alice.force_login(UserFactory(username="alice"))
    bob.force_login(UserFactory(username="bob"))

    for_alice = post(alice, view_kind.url, {"amount": 10}, key="shared-key")
    for_bob = post(bob, view_kind.url, {"amount": 10}, key="shared-key")

    assert for_bob.status_code == 201
    assert "Idempotent-Replayed" not in for_bob
    assert json.loads(for_bob.content)["id"] != json.loads(for_alice.content)["id"]
    assert Charge.objects.count() == 2
    assert sorted(record.owner for record in stored()) == sorted(
        [str(alice.session["_auth_user_id"]), str(bob.session["_auth_user_id"])]
    )


def test_anonymous_and_authenticated_clients_do_not_share_keys() -> None:
    signed_in = Client()
    signed_in.force_login(UserFactory())

    post(signed_in, "/function/charges/", key="shared-key")
    anonymous = post(Client(), "/function/charges/", key="shared-key")

    assert "Idempotent-Replayed" not in anonymous
    assert Charge.objects.count() == 2


def test_a_tenant_resolver_scopes_keys_by_tenant(client: Client) -> None:
    with override_settings(IDEMPOTENCY_OWNER_RESOLVER="tests.test_scoping.tenant_owner"):
        post(client, "/function/charges/", key="k", **{"X-Tenant": "acme"})
        other_tenant = post(client, "/function/charges/", key="k", **{"X-Tenant": "globex"})
        same_tenant = post(client, "/function/charges/", key="k", **{"X-Tenant": "acme"})

    assert "Idempotent-Replayed" not in other_tenant
    assert same_tenant["Idempotent-Replayed"] == "true"
    assert {record.owner for record in stored()} == {
        "tenant:acme",
        "tenant:globex",
    }


def test_namespaces_keep_the_same_key_apart(client: Client) -> None:
    """The refund action has its own namespace: the same key there is a new request."""
    post(client, ViewKind.VIEWSET_MIXIN.url, key="k")
    refund = post(client, ViewKind.VIEWSET_ACTION.url, key="k")

    assert refund.status_code == 201
    assert "Idempotent-Replayed" not in refund
    assert {record.namespace for record in stored()} == {
        "default",
        "refunds",
    }
