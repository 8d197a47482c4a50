"""Steps of an operation: recovery points a retry skips, whose outbound calls share a key."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured, SynchronousOnlyOperation

from django_idempotency import crashes
from django_idempotency.attempts import Attempt, current_attempt
from django_idempotency.exceptions import StepAmbiguous
from django_idempotency.results import serializer_for

T = TypeVar("T")

# What an at-most-once step stores before its call: no serializer's output starts with a NUL.
STARTED = b"\x00started"

# The name of the step the running code is in, if any (innermost operation only).
_current_step: ContextVar[str | None] = ContextVar("django_idempotency_step", default=None)


def current_step_name() -> str | None:
    """The name of the step running now, or None outside a step."""
    return _current_step.get()


def step(
    name: str, func: Callable[..., T], /, *args: Any, at_most_once: bool = False, **kwargs: Any
) -> T:
    """Run ``func(*args, **kwargs)`` as the step `name` of the operation holding a lease-mode
    claim, once: if this operation completed the step before (in an attempt that crashed, or
    earlier in this one), return its stored result without calling `func`.

    Otherwise the lease is checked first (`LeaseLost` if it was taken over), `func` runs with
    `current_step_name()` set to `name` (outbound calls derive their keys from it), and its
    result is stored as JSON (a dataclass or pydantic model named by `func`'s return annotation
    comes back as one) with one fenced write. Outside a guarded operation `func` simply runs
    (in the step: `current_step_name()` is `name`), and nothing is stored.

    A step interrupted mid-call (its process killed, its lease lost) runs again on the retry:
    at least once, with the same outbound keys. With ``at_most_once=True`` a fenced write says
    it started before `func` is called, and a retry that finds it started but not finished
    raises `StepAmbiguous` instead of calling `func` again, until an operator says whether it
    happened (`resolve_step`, or the admin).
    """
    attempt = _operation(name)
    if attempt is None:
        with _in_step(name):
            return func(*args, **kwargs)
    _refuse_in_event_loop(name)
    serializer = serializer_for(func)
    stored = _stored(attempt, name)
    if stored is not None:
        return serializer.loads(stored)  # type: ignore[no-any-return]
    attempt.ensure_lease()
    if at_most_once:
        _refuse_in_transaction(attempt, name)
        attempt.save_step(name, STARTED)
    with _in_step(name):
        result = func(*args, **kwargs)
    crashes.reached("step.ran", name)
    attempt.save_step(name, serializer.dumps(result))
    crashes.reached("step.saved", name)
    return result


async def astep(
    name: str,
    func: Callable[..., Awaitable[T]],
    /,
    *args: Any,
    at_most_once: bool = False,
    **kwargs: Any,
) -> T:
    """`step` for a coroutine function, awaited; the store is called through `sync_to_async`."""
    attempt = _operation(name)
    if attempt is None:
        with _in_step(name):
            return await func(*args, **kwargs)
    serializer = serializer_for(func)
    stored = _stored(attempt, name)
    if stored is not None:
        return serializer.loads(stored)  # type: ignore[no-any-return]
    await attempt.aensure_lease()
    if at_most_once:
        await sync_to_async(_refuse_in_transaction)(attempt, name)
        await sync_to_async(attempt.save_step)(name, STARTED)
    with _in_step(name):
        result = await func(*args, **kwargs)
    crashes.reached("step.ran", name)
    await sync_to_async(attempt.save_step)(name, serializer.dumps(result))
    crashes.reached("step.saved", name)
    return result


def _stored(attempt: Attempt, name: str) -> bytes | None:
    """The step's stored result; `StepAmbiguous` for an at-most-once step that started and
    never finished."""
    stored = attempt.stored_step(name)
    if stored == STARTED:
        raise StepAmbiguous(
            name,
            f"Step {name!r} runs at most once, and an earlier attempt started it without "
            "finishing: whether it happened is unknown, so it is not run again. Find out, then "
            "mark it done or not done (django_idempotency.steps.resolve_step, or the admin).",
        )
    return stored


def _refuse_in_transaction(attempt: Attempt, name: str) -> None:
    """Refuse an at-most-once step inside a transaction of the caller's (its own
    `transaction.atomic()`, ATOMIC_REQUESTS): its mark that it started would roll back with that
    transaction, and the retry would run it again."""
    if attempt.store.claims_privately():
        raise ImproperlyConfigured(
            f"step({name!r}, at_most_once=True) runs inside a database transaction, which would "
            "take the mark that it started with it if it rolled back: the retry would run it "
            "again. Run it outside transaction.atomic() (and ATOMIC_REQUESTS: decorate the view "
            "with transaction.non_atomic_requests)."
        )


def _operation(name: str) -> Attempt | None:
    """The attempt whose steps these are; None outside one. Atomic mode is refused: its claim
    commits with the work, so a crash leaves no step behind for a retry to skip."""
    attempt = current_attempt()
    if attempt is not None and attempt.atomic:
        raise ImproperlyConfigured(
            f"step({name!r}) runs inside an atomic-mode operation, whose claim and writes commit"
            " together at its end: nothing of a crashed attempt survives for a retry to resume"
            " from. Use mode='lease' on the view, function or task that runs it."
        )
    return attempt


def _refuse_in_event_loop(name: str) -> None:
    """Refuse `step` in a thread running an event loop, before its work runs: storing its
    result there would fail after the side effect (Django refuses the query), and the retry
    would run the side effect again."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return  # Synchronous code: the store may be called here.
    if os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE"):
        return  # The project lets Django query from here, as Django itself then does.
    raise SynchronousOnlyOperation(
        f"step({name!r}) was called from async code, where its result could not be stored "
        f"after its work ran: use `await astep({name!r}, ...)` with a coroutine function, or "
        "wrap the synchronous caller in sync_to_async."
    )


@contextlib.contextmanager
def _in_step(name: str) -> Iterator[None]:
    token = _current_step.set(name)
    try:
        yield
    finally:
        _current_step.reset(token)


def resolve_step(
    key: str, *, namespace: str, owner: str = "", step: str, happened: bool, result: Any = None
) -> None:
    """Say whether the interrupted at-most-once step `step` of the operation with this key
    happened: if so, the retry resumes after it, with `result` (JSON) as its result; if not,
    the retry runs it. On the database store; `LookupError` when the key has no such step,
    `KeyInProgress` while an attempt holds the key.
    """
    import base64
    import json

    from django.db import transaction

    from django_idempotency.conf import conf
    from django_idempotency.encryption import seal_step, unseal_step
    from django_idempotency.exceptions import KeyInProgress
    from django_idempotency.models import IdempotencyRecord
    from django_idempotency.stores import get_store
    from django_idempotency.stores.database import DatabaseStore, records_alias

    store = get_store()
    if not isinstance(getattr(store, "inner", store), DatabaseStore):
        raise NotImplementedError("resolve_step() works on the database store.")
    alias = records_alias()
    with transaction.atomic(using=alias):
        records = IdempotencyRecord.objects.using(alias).select_for_update()
        record = records.filter(namespace=namespace, owner=owner, key=key).first()
        steps = dict(record.steps or {}) if record is not None else {}
        stored = steps.get(step)
        if record is None or stored is None:
            raise LookupError(f"The key has no step {step!r} stored.")
        if unseal_step(base64.b64decode(stored), conf.ENCRYPTION_KEYS) != STARTED:
            raise LookupError(f"Step {step!r} finished: there is nothing to resolve.")
        lease_end = record.lease_expires_at
        if lease_end is not None and lease_end > store.now():
            raise KeyInProgress("An attempt holds the key: resolve its step once it has ended.")
        if happened:
            encoded = json.dumps(result, allow_nan=False)
            if json.loads(encoded) != result:
                raise TypeError(
                    f"result={result!r} would come back changed from JSON (a tuple as a list, "
                    "keys as strings): give the value as JSON reads it."
                )
            sealed = seal_step(encoded.encode(), conf.ENCRYPTION_KEYS)
            steps[step] = base64.b64encode(sealed).decode()
        else:
            del steps[step]
        record.steps = steps
        record.save(update_fields=["steps"])
