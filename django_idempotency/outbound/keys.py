"""The key an outbound call sends: derived from the operation it runs in and the step's name."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

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
    `@idempotent_function`, an `idempotent_task`): the same on every run of that operation, on
    every machine. Outside an operation, the caller's `parts` stand for it.

    Inside one: ``mint_key(scope.namespace, "owner:" + scope.owner, scope.key, step, *parts,
    namespace=namespace)`` of the claim's scope. Outside: ``mint_key(step, *parts,
    namespace=namespace)``. Give each downstream API its own `namespace`.
    """
    attempt = current_attempt()
    scope = attempt.scope if attempt is not None else None
    if scope is not None:
        return mint_key(*operation_parts(scope), step, *parts, namespace=namespace)
    if not parts:
        raise OutsideOperation(
            f"No idempotent operation is running to derive the key of step {step!r} from: "
            f"pass the parts that identify the call, key_for({step!r}, order.pk) (through a "
            "transport: as the request's Idempotency-Key header), or make the call from a "
            "guarded view, an @idempotent_function or an idempotent_task."
        )
    return mint_key(step, *parts, namespace=namespace)


def operation_parts(scope: Scope) -> tuple[str, str, str]:
    # The owner is empty for anonymous requests, which mint_key refuses as a part: prefixed,
    # every owner is a distinct non-blank part.
    return scope.namespace, f"owner:{scope.owner}", scope.key


@dataclass(frozen=True)
class KeyChoice:
    """The key a request is sent with (None: none), and where it came from."""

    key: str | None
    step: str = ""  # The step it was derived from; empty for the caller's own key.
    scope: Scope | None = None  # The operation it belongs to, if any.


def choose_key(
    method: str, given_key: str | None, given_step: str | None, *, namespace: str
) -> KeyChoice:
    """The key for a request: the `Idempotency-Key` it already carries, else for an unsafe
    method one derived from the step the caller named (or the step running now)."""
    attempt = current_attempt()
    scope = attempt.scope if attempt is not None else None
    if given_key is not None:
        return KeyChoice(given_key, scope=scope)
    if method.upper() in SAFE_METHODS:
        return KeyChoice(None)
    step = given_step or current_step_name()
    if step is None:
        return KeyChoice(None, scope=scope)
    return KeyChoice(key_for(step, namespace=namespace), step=step, scope=scope)
