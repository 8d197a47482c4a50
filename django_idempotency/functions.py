"""`@idempotent_function`: run any callable once per key; a repeat returns the stored result."""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, TypeVar, cast

from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured

from django_idempotency.attempts import FIRST_DELAY, Attempt, next_delay
from django_idempotency.conf import conf
from django_idempotency.core.fingerprint import canonical_json, fingerprint
from django_idempotency.core.keys import (
    MAX_KEY_LENGTH,
    MAX_NAMESPACE_LENGTH,
    MAX_OWNER_LENGTH,
    InvalidKey,
)
from django_idempotency.core.outcomes import Claim, Outcome, Scope, StoredResponse, is_not_stored
from django_idempotency.exceptions import KeyInProgress, KeyMismatch, ResultNotStored
from django_idempotency.options import Mode, OnConflict, check_options, to_timedelta
from django_idempotency.recoverable import FUNCTION, Recoverable, check_store, encoded, recoverable
from django_idempotency.results import ResultSerializer, serializer_for

Func = TypeVar("Func", bound=Callable[..., Any])
# Picks a value from the call's arguments: a parameter's name, or a callable taking them all.
ArgumentPicker = str | Callable[..., Any]


class InvalidOwner(ValueError):
    """A call's owner that the record store cannot hold; the message says why and what to do."""


@dataclass(frozen=True)
class Call:
    """One call of an idempotent callable, as the store sees it."""

    scope: Scope
    fingerprint: str
    label: str  # Shown as the record's path: which function or task ran.
    method: str  # Shown as the record's method: "CALL" or "TASK".


@dataclass(frozen=True)
class RunOptions:
    """How a call is run: lifetime of its record, mode, conflict policy, result format."""

    ttl: timedelta | float | None = None
    mode: Mode | None = None
    on_conflict: OnConflict | None = None
    serializer: ResultSerializer | None = None
    lease: timedelta | float | None = None
    # The recovery of a recover=True function or task: its calls are kept while they run.
    recover: Recoverable | None = None

    def __post_init__(self) -> None:
        check_options(ttl=self.ttl, lease=self.lease, mode=self.mode, on_conflict=self.on_conflict)

    @property
    def lease_length(self) -> timedelta:
        """The lease of a lease-mode claim: this call's, else IDEMPOTENCY_LEASE."""
        return conf.LEASE if self.lease is None else to_timedelta(self.lease, "lease")


def namespace_of(namespace: str | None, label: str, decorator: str) -> str:
    """The namespace of a function's or task's keys: the one given, else its dotted name."""
    chosen = namespace or label
    if len(chosen) > MAX_NAMESPACE_LENGTH:
        raise ImproperlyConfigured(
            f"The default namespace {chosen!r} is longer than {MAX_NAMESPACE_LENGTH} "
            f"characters: pass namespace= to {decorator}."
        )
    return chosen


def run_once(
    call: Call,
    work: Callable[[], Any],
    options: RunOptions,
    serializer: ResultSerializer,
    arguments: bytes | None = None,
) -> Any:
    """Run ``work`` if this call claims its key; return the stored result if one exists.

    Raises `KeyInProgress`, `KeyMismatch` or `StoreUnavailable`. An exception from ``work``
    releases the key (atomic mode rolls back the work's own writes with it) and propagates.
    With `options.recover`, the call's `arguments` (`recovery.encoded`) are kept while it runs.
    """
    recovery = options.recover
    mode = "lease" if recovery is not None else options.mode or conf.MODE
    on_conflict = options.on_conflict or conf.ON_CONFLICT
    kept_now = False
    if recovery is not None:
        assert arguments is not None
        check_store()
        kept_now = recovery.keep(call.scope, arguments)
    with Attempt(atomic=mode == "atomic", on_conflict=on_conflict) as attempt:
        claim = attempt.claim_key(
            call.scope,
            call.fingerprint,
            method=call.method,
            path=call.label,
            ttl=_ttl(options),
            lease=options.lease_length,
        )
        if claim.outcome is not Outcome.FRESH:
            return _answer(call, claim, serializer)
        if recovery is not None and not kept_now:
            recovery.claimed(call.scope, cast(bytes, arguments))
        result = work()
        if attempt.complete(_stored(result, serializer)) and recovery is not None:
            recovery.forget(call.scope)
        return result


async def run_once_async(
    call: Call,
    work: Callable[[], Awaitable[Any]],
    options: RunOptions,
    serializer: ResultSerializer,
) -> Any:
    """`run_once` for a coroutine function: the store is called through `sync_to_async`.

    A transaction cannot stay open across awaits, so the claim is leased whatever the mode (as
    for an async view); on_conflict="wait" sleeps with asyncio.sleep between tries, so that the
    event loop and Django's one shared sync thread stay free for the call it waits for.
    """
    on_conflict = options.on_conflict or conf.ON_CONFLICT
    polls = on_conflict == "wait"
    deadline = time.monotonic() + conf.WAIT_TIMEOUT.total_seconds()
    started = time.perf_counter()
    delay = FIRST_DELAY
    while True:
        attempt = Attempt(atomic=False, on_conflict=on_conflict, poll=polls)
        claim = await sync_to_async(attempt.claim_key)(
            call.scope,
            call.fingerprint,
            method=call.method,
            path=call.label,
            ttl=_ttl(options),
            lease=options.lease_length,
        )
        if not (polls and claim.outcome is Outcome.IN_PROGRESS):
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            await sync_to_async(attempt.announce_conflict)(time.perf_counter() - started)
            break
        await asyncio.sleep(min(delay, remaining))
        delay = next_delay(delay)
    if claim.outcome is not Outcome.FRESH:
        return _answer(call, claim, serializer)
    try:
        result = await work()
        stored = _stored(result, serializer)
    except BaseException:
        await sync_to_async(attempt.abort)()
        raise
    await sync_to_async(attempt.complete)(stored)
    return result


def _ttl(options: RunOptions) -> timedelta:
    return conf.TTL if options.ttl is None else to_timedelta(options.ttl, "ttl")


def _answer(call: Call, claim: Claim, serializer: ResultSerializer) -> Any:
    """The stored result of a replay; the error of a mismatch or of a call still running."""
    if claim.outcome is Outcome.REPLAY:
        assert claim.response is not None
        if is_not_stored(claim.response):
            raise ResultNotStored(
                f"{call.label} already ran with the key {call.scope.key!r}, but its result could "
                "not be stored, so it cannot be returned again. It was not run again: read its "
                "effects instead."
            )
        return serializer.loads(claim.response.body)
    if claim.outcome is Outcome.MISMATCH:
        raise KeyMismatch(
            f"The key {call.scope.key!r} of {call.label} was already used with a different "
            "payload: use a new key for new work."
        )
    raise KeyInProgress(
        f"{call.label} is still running with the key {call.scope.key!r}: try again once "
        "it has finished, or use on_conflict='wait'."
    )


def _stored(result: Any, serializer: ResultSerializer) -> StoredResponse:
    return StoredResponse(
        200, [("Content-Type", serializer.content_type)], serializer.dumps(result)
    )


def idempotent_function(
    *,
    key: ArgumentPicker,
    namespace: str | None = None,
    ttl: timedelta | float | None = None,
    payload: ArgumentPicker | Sequence[str] | None = None,
    owner: ArgumentPicker | None = None,
    mode: Mode | None = None,
    on_conflict: OnConflict | None = None,
    serializer: ResultSerializer | None = None,
    lease: timedelta | float | None = None,
    recover: bool = False,
) -> Callable[[Func], Func]:
    """Run the decorated callable once per key; every repeat returns the stored result.

    ``key``, ``owner`` and ``payload`` pick values from the call's arguments: a parameter's
    name, or a callable that takes the same arguments. The payload (default: every argument)
    is fingerprinted as canonical JSON: a repeat whose payload differs raises `KeyMismatch`. A
    repeat while the first call runs raises `KeyInProgress` (or waits, with
    ``on_conflict="wait"``). The result is stored as JSON (``serializer`` to change that).

    An ``async def`` callable is awaited with the same semantics; its claim is always leased
    (a transaction cannot stay open across awaits), so ``mode="atomic"`` does not roll its
    writes back when it raises: the key is released and a retry runs it again.

    A leased claim (``mode="lease"``, or an async callable) lasts ``lease`` (default
    IDEMPOTENCY_LEASE) and is renewed while the call runs; inside it, `steps.step` marks
    recovery points that a retry after a crash skips.

    ``recover=True`` (lease mode, the database store, synchronous callables at a module's top
    level): each call's arguments are kept, as JSON, while it runs, and
    `recovery.recover_operations` calls it again if its lease ends without it completing.
    """
    # Checked now, where the decorator is declared, not at the first call.
    declared = RunOptions(
        ttl=ttl, mode=mode, on_conflict=on_conflict, serializer=serializer, lease=lease
    )

    def decorate(func: Func) -> Func:
        label = f"{func.__module__}.{func.__qualname__}"
        keys_namespace = namespace_of(namespace, label, "@idempotent_function")
        arguments = CallArguments(func, key=key, owner=owner, payload=payload)
        result_format = lazy_serializer(func, serializer)
        recovery = None
        if recover:
            if inspect.iscoroutinefunction(func):
                raise ImproperlyConfigured(
                    f"recover=True is for synchronous callables; {func.__qualname__} is async."
                )
            target = f"{func.__module__}:{func.__qualname__}"

            def scope_of(args: list[Any], kwargs: dict[str, Any], task_id: str | None) -> Scope:
                return arguments.call(keys_namespace, label, "CALL", args, kwargs).scope

            recovery = recoverable(
                FUNCTION, target, scope_of, mode=mode, qualname=func.__qualname__
            )
        options = replace(declared, recover=recovery)

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                if not conf.ENABLED:
                    return await func(*args, **kwargs)
                call = arguments.call(keys_namespace, label, "CALL", args, kwargs)
                return await run_once_async(
                    call, lambda: func(*args, **kwargs), options, result_format()
                )

            return cast(Func, async_wrapper)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not conf.ENABLED:
                return func(*args, **kwargs)
            call = arguments.call(keys_namespace, label, "CALL", args, kwargs)
            kept = encoded(args, kwargs) if recovery is not None else None
            return run_once(call, lambda: func(*args, **kwargs), options, result_format(), kept)

        return cast(Func, wrapper)

    return decorate


class CallArguments:
    """Reads a call's key, owner and payload from its arguments."""

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        key: ArgumentPicker | None,
        owner: ArgumentPicker | None,
        payload: ArgumentPicker | Sequence[str] | None,
        skip_first: bool = False,
    ) -> None:
        signature = inspect.signature(func)
        if skip_first:  # A bound task's `self`.
            signature = signature.replace(parameters=list(signature.parameters.values())[1:])
        self.signature = signature
        self.key = key
        self.owner = owner
        self.payload = payload
        names = [picker for picker in (key, owner, payload) if isinstance(picker, str)]
        if payload is not None and not isinstance(payload, str) and not callable(payload):
            names += payload
        for name in names:
            if name not in self.signature.parameters:
                raise ImproperlyConfigured(
                    f"{func.__qualname__} has no parameter {name!r}: name one of "
                    f"{', '.join(self.signature.parameters)}, or pass a callable."
                )

    def call(
        self,
        namespace: str,
        label: str,
        method: str,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        default_key: str | None = None,
    ) -> Call:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        key = default_key if self.key is None else self._pick(self.key, bound, args, kwargs)
        owner = "" if self.owner is None else self._pick(self.owner, bound, args, kwargs)
        payload: Any
        if self.payload is None:
            payload = dict(bound.arguments)
        elif isinstance(self.payload, str) or callable(self.payload):
            payload = self._pick(self.payload, bound, args, kwargs)
        else:
            payload = {name: bound.arguments[name] for name in self.payload}
        try:
            body = canonical_json(payload)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"The payload of {label} is not JSON-serialisable ({exc}): pass payload= "
                "naming the arguments that identify the work, or a callable returning JSON data."
            ) from exc
        return Call(
            scope=Scope(namespace, _checked_owner(owner, label), _checked_key(key, label)),
            fingerprint=fingerprint(method, label, body),
            label=label,
            method=method,
        )

    @staticmethod
    def _pick(
        picker: ArgumentPicker,
        bound: inspect.BoundArguments,
        args: Sequence[Any],
        kwargs: dict[str, Any],
    ) -> Any:
        if isinstance(picker, str):
            return bound.arguments[picker]
        return picker(*args, **kwargs)


def _checked_key(key: Any, label: str) -> str:
    if isinstance(key, int) and not isinstance(key, bool):
        key = str(key)
    if not isinstance(key, str) or not key:
        raise InvalidKey(
            f"The idempotency key of {label} must be a non-empty string of at most "
            f"{MAX_KEY_LENGTH} characters, not {key!r}: see mint_key() to derive one."
        )
    return _storable(key, "key", label, MAX_KEY_LENGTH, InvalidKey)


def _checked_owner(owner: Any, label: str) -> str:
    return _storable(str(owner), "owner", label, MAX_OWNER_LENGTH, InvalidOwner)


def _storable(value: str, part: str, label: str, limit: int, error: type[ValueError]) -> str:
    """`value` if the record's column can hold it on every database; else `error`, saying why.

    Checked before the store is asked: PostgreSQL would refuse it with a DataError from deep
    inside the claim, and SQLite would store what PostgreSQL cannot.
    """
    fix = f"derive the {part} from such values with mint_key(), which hashes them."
    if len(value) > limit:
        problem = f"is {len(value)} characters long; the limit is {limit}"
    elif "\x00" in value:
        problem = "contains a NUL character, which text columns cannot hold"
    elif not _encodes(value):
        problem = "is not valid Unicode (it holds a lone surrogate)"
    else:
        return value
    raise error(f"The {part} of {label} {problem}: {fix}")


def _encodes(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def lazy_serializer(
    func: Callable[..., Any], serializer: ResultSerializer | None
) -> Callable[[], ResultSerializer]:
    """The return annotation may name a class defined after the function: resolve it late."""
    if serializer is not None:
        return lambda: serializer
    return functools.cache(lambda: serializer_for(func))
