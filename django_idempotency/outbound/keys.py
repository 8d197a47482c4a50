"""The key an outbound call sends: derived from the operation it runs in and the step's name."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from django.core.exceptions import ImproperlyConfigured

from django_idempotency.attempts import current_attempt
from django_idempotency.core.keys import mint_key
from django_idempotency.core.outcomes import Scope
from django_idempotency.steps import current_step_name

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
KEY_HEADER = "Idempotency-Key"  # The IETF draft's name, which downstream APIs read.
# How a caller names the step of one request: httpx's request extension, or (requests, where
# a request has no extensions) a header the adapter takes off before the request is sent.
STEP_EXTENSION = "idempotency_step"
STEP_HEADER = "Idempotency-Step"


class OutsideOperation(ValueError):
    """A key was asked for from a step name alone, outside any operation to derive it from."""


def key_for(step: str, *parts: str | int | uuid.UUID, namespace: str = "default") -> str:
    """The key for step `step` of the operation running now (a guarded view, an
    `@idempotent_function`, an `idempotent_task`): the same on every run of that operation (its
    crashed attempt and the same request's retry), on every machine, and never the key of
    another operation, even one under the same client key. Outside an operation, the caller's
    `parts` stand for it.

    Inside one: ``mint_key(scope.namespace, "owner:" + scope.owner, scope.key, "operation:" +
    operation_id, step, *parts, namespace=namespace)`` of the claim's scope and the
    operation's identity (without the "operation:" part for a record made before identities
    were kept, which has none). Outside: ``mint_key(step, *parts, namespace=namespace)``.
    Give each downstream API its own `namespace`.
    """
    attempt = current_attempt()
    if attempt is not None and attempt.scope is not None:
        if attempt.atomic:
            # Its record is rolled back with a failure, its identity with it: the retry would be
            # a new operation, sending another key for a call that may have been made.
            raise ImproperlyConfigured(
                f"key_for({step!r}) derives a key inside an atomic-mode operation, whose record "
                "is rolled back with the transaction when it fails, so its retry would send the "
                "downstream another key, and a call already made would be made again. Use "
                "mode='lease' on the view, function or task that makes outbound calls, or send "
                "a key of your own (an Idempotency-Key header on the request)."
            )
        # The operation must now outlive a failure of this attempt, for its retry to send
        # this key again.
        attempt.identity_shared = True
        operation = operation_parts(attempt.scope, attempt.operation_id)
        return mint_key(*operation, step, *parts, namespace=namespace)
    if not parts:
        raise OutsideOperation(
            f"No idempotent operation is running to derive the key of step {step!r} from: "
            f"pass the parts that identify the call, key_for({step!r}, order.pk) (through a "
            "transport: as the request's Idempotency-Key header), or make the call from a "
            "guarded view, an @idempotent_function or an idempotent_task."
        )
    return mint_key(step, *parts, namespace=namespace)


def operation_parts(scope: Scope, operation_id: str | None) -> tuple[str, ...]:
    """What identifies an operation in the keys derived from it: its scope, and its identity
    (none for a record made before identities were kept: its keys derive as they did then)."""
    # The owner is empty for anonymous requests, which mint_key refuses as a part: prefixed,
    # every owner is a distinct non-blank part.
    parts = (scope.namespace, f"owner:{scope.owner}", scope.key)
    return (*parts, f"operation:{operation_id}") if operation_id else parts


@dataclass(frozen=True)
class KeyChoice:
    """The key a request is sent with (None: none), and where it came from."""

    key: str | None
    step: str = ""  # The step it was derived from; empty for the caller's own key.
    scope: Scope | None = None  # The operation it belongs to, if any.
    operation_id: str = ""  # That operation's identity; empty outside one (or with none).


def choose_key(
    method: str, given_key: str | None, given_step: str | None, *, namespace: str
) -> KeyChoice:
    """The key for a request: the `Idempotency-Key` it already carries, else for an unsafe
    method one derived from the step the caller named (or the step running now)."""
    attempt = current_attempt()
    scope = attempt.scope if attempt is not None else None
    operation_id = (attempt.operation_id if attempt is not None else None) or ""
    if given_key is not None:
        return KeyChoice(given_key, scope=scope, operation_id=operation_id)
    if method.upper() in SAFE_METHODS:
        return KeyChoice(None)
    step = given_step or current_step_name()
    if step is None:
        return KeyChoice(None, scope=scope, operation_id=operation_id)
    key = key_for(step, namespace=namespace)
    return KeyChoice(key, step=step, scope=scope, operation_id=operation_id)
