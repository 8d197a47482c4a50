"""Owner resolvers: who a key belongs to, so one client never receives another's response."""

from __future__ import annotations

import hashlib
from typing import Any
from uuid import UUID

from django.core.exceptions import ImproperlyConfigured
from django.db.models import Model
from django.http import HttpRequest


class OwnerUnknown(Exception):
    """The request was authenticated by something that does not tell one client from another.

    Scoping its key by nobody would let every such client receive the others' responses, so the
    guard refuses the request instead (500 owner-unknown). An owner resolver may raise it too.
    """


def authenticated_user(request: Any) -> str:
    """Who the request's framework authenticated, as the owner of its key; "" for nobody.

    - A DRF `Request`: its user when authenticated, else what its authentication set in
      ``request.auth`` (an API key, a client model).
    - A request Django Ninja authenticated (``auth=``): ``request.auth``, whatever it returned;
      when that is no identity (``True``), the user Django signed in.
    - Any other request: ``request.user``, which AuthenticationMiddleware sets.

    A user is its primary key, as it always was; any other principal is named by its kind and
    never held as it is: see `identify`. Raises `OwnerUnknown` when the request was
    authenticated and nothing identifies who sent it.
    """
    credential = getattr(request, "auth", None)
    if credential is None:
        return _user(getattr(request, "user", None)) or ""
    if isinstance(request, HttpRequest):
        # Ninja's `auth=` is the framework's own word on who sent the request; Django's user
        # (a session beside an API key) is not. An `auth=` that returned no identity (it checked
        # the signed-in user, say) leaves that user as the best one there is.
        owner = identify(credential)
        if not owner:
            owner = _user(getattr(request, "user", None)) or owner
    else:
        # DRF's user is its authentication's own (a token's user): the owner records have had.
        owner = _user(request.user) or identify(credential)
    if owner is None:
        raise OwnerUnknown(_unknown(request, credential))
    return owner


def identify(principal: Any) -> str | None:
    """The owner naming what an authentication returned; None when it names no one.

    - a user of the project's user model: its primary key, as ``request.user`` always gave;
    - any other model instance: ``<app_label>.<model>:<pk>``, the primary key hashed unless it is
      an integer (a string or UUID primary key may be the credential itself, as DRF's
      authtoken keys are);
    - a string, bytes, an integer or a UUID (an API key, a token, a client name):
      ``sha256:<hash>`` of it, never the value, which may be a credential;
    - an object with ``is_authenticated`` (a user that is no model, as a JWT's): its ``pk``, or
      "" when it is not authenticated;
    - anything else (``True``, a dict of claims): None.
    """
    if principal is None or isinstance(principal, bool):
        return None
    if isinstance(principal, Model):
        if principal.pk is None:
            return None
        if _is_user_model(principal):
            return str(principal.pk)
        model = principal._meta.concrete_model or type(principal)  # A proxy is its model.
        label = model._meta.label_lower
        primary_key = principal.pk
        if isinstance(primary_key, int):
            return f"{label}:{primary_key}"
        return f"{label}:{_digest(_encoded(primary_key))}"
    if isinstance(principal, bytes):
        return _digest(principal)
    if isinstance(principal, (str, int, UUID)):
        return _digest(_encoded(principal))
    authenticated = getattr(principal, "is_authenticated", None)
    if isinstance(authenticated, bool):
        if not authenticated:
            return ""
        primary_key = getattr(principal, "pk", None)
        return None if primary_key is None else str(primary_key)
    return None


def _user(user: Any) -> str | None:
    """The authenticated user's owner; None for no user or an anonymous one."""
    if user is None:
        return None
    if isinstance(user, Model) and not _is_user_model(user):
        # A model standing in for a user (an API client a DRF authentication returned as the
        # user): its primary key alone would be the same as some user's.
        return identify(user) or None
    if not getattr(user, "is_authenticated", False):
        return None
    return str(user.pk)


def _is_user_model(instance: Model) -> bool:
    from django.contrib.auth import get_user_model  # Imported here: auth may not be installed.

    try:
        return isinstance(instance, get_user_model())
    except ImproperlyConfigured:
        return False


def _encoded(value: object) -> bytes:
    # A string decoded from JSON may hold a lone surrogate, which UTF-8 alone refuses.
    return str(value).encode("utf-8", "surrogatepass")


def _digest(value: bytes) -> str:
    # A full SHA-256: owners must never meet, where a log's key hash only needs to be followed.
    return "sha256:" + hashlib.sha256(value).hexdigest()


def _unknown(request: Any, credential: Any) -> str:
    """Why the owner is unknown, naming the credential's type, never its value."""
    where = "Django Ninja's auth=" if isinstance(request, HttpRequest) else "DRF's authentication"
    return (
        f"{where} gave request.auth a {type(credential).__qualname__}, which does not tell one "
        "client from another, and no user is signed in, so the request was not run: its key "
        "would be shared with every other client. Return the user, a model instance or a string "
        "naming the client from the authentication, or set IDEMPOTENCY_OWNER_RESOLVER to a "
        "callable that returns who sent the request."
    )
