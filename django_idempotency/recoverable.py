"""A `recover=True` function's or task's calls, kept while they run for the sweep to re-run."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, transaction
from django.utils import timezone

from django_idempotency.conf import conf
from django_idempotency.core.outcomes import Scope
from django_idempotency.encryption import seal_step

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from django_idempotency.models import RecoverableOperation

# RecoverableOperation's kinds and states, named here without importing the models: the
# package's root imports this module (through `functions`) before the apps are ready.
FUNCTION, TASK = "function", "task"
RUNNING, FAILED = "running", "failed"


@dataclass(frozen=True)
class Recoverable:
    """What the sweep needs to call a function or task again: its kind and name, and how its
    arguments name the key (to check, before calling, that they still name the kept one)."""

    kind: str
    target: str
    scope_of: Callable[[list[Any], dict[str, Any], str | None], Scope] = field(compare=False)

    def keep(self, scope: Scope, arguments: bytes) -> bool:
        """Before the claim: keep this call's arguments under its scope where none are kept yet
        (True: kept now), so that a worker dying right after its claim has left them, and a
        call then refused as a mismatch overwrites nothing."""
        rows = kept_calls()
        now = timezone.now()
        try:
            with transaction.atomic(using=rows.db):
                rows.create(
                    namespace=scope.namespace,
                    owner=scope.owner,
                    key=scope.key,
                    next_attempt_at=now,
                    created_at=now,
                    **self._values(arguments, now),
                )
        except IntegrityError:
            return False  # Kept by an earlier call with this key.
        return True

    def claimed(self, scope: Scope, arguments: bytes) -> None:
        """This call claimed the key, its arguments kept by an earlier call: its own now, for
        it is the operation (the earlier one's record was given back, or expired)."""
        now = timezone.now()
        kept_calls().filter(namespace=scope.namespace, owner=scope.owner, key=scope.key).update(
            **self._values(arguments, now)
        )

    def _values(self, arguments: bytes, now: datetime) -> dict[str, Any]:
        sealed = seal_step(arguments, conf.ENCRYPTION_KEYS)
        return {
            "kind": self.kind,
            "target": self.target,
            "arguments": sealed,
            "state": RUNNING,
            "updated_at": now,
        }

    def forget(self, scope: Scope) -> None:
        """The call completed: nothing is left to recover."""
        kept_calls().filter(namespace=scope.namespace, owner=scope.owner, key=scope.key).delete()


# Every recover=True function and task of this process, by target: the sweep checks with it
# that the arguments it kept still name the call's key.
DECLARED: dict[str, Recoverable] = {}


def recoverable(
    kind: str,
    target: str,
    scope_of: Callable[[list[Any], dict[str, Any], str | None], Scope],
    *,
    mode: str | None,
    qualname: str,
) -> Recoverable:
    """The recovery of a function or task declared with ``recover=True``; refused where a
    sweep could not call it again, or where nothing would be left to recover."""
    if "<locals>" in qualname:
        raise ImproperlyConfigured(
            f"recover=True needs {qualname} to be importable by its name, for the recovery "
            "sweep to call it again: declare it at a module's top level."
        )
    if mode == "atomic":
        raise ImproperlyConfigured(
            f"recover=True on {qualname} in atomic mode: a crash rolls the whole call back, so "
            "nothing is left to recover. Leave mode unset (recover=True runs in lease mode)."
        )
    recovery = Recoverable(kind, target, scope_of)
    DECLARED[target] = recovery
    return recovery


def check_store() -> None:
    """Refuse a store other than the database's (with or without the cache tier)."""
    from django_idempotency.stores import get_store
    from django_idempotency.stores.database import DatabaseStore

    store = get_store()
    if not isinstance(getattr(store, "inner", store), DatabaseStore):
        raise ImproperlyConfigured(
            "recover=True keeps each call's arguments in the database, beside its record: it "
            "needs the database store (IDEMPOTENCY_STORE), with or without the cache tier."
        )


def encoded(args: Any, kwargs: Any, task_id: str | None = None) -> bytes:
    """A call's arguments (and a task's id) as the sweep calls it again with them; `TypeError`,
    before anything ran, for arguments that are not JSON."""
    values: dict[str, Any] = {"args": list(args), "kwargs": dict(kwargs)}
    if task_id is not None:
        values["task_id"] = task_id
    try:
        dumped = json.dumps(values, allow_nan=False)
        if json.loads(dumped) != values:
            # A tuple would come back a list, an int key a string: the sweep's call would not
            # be this one (its key or payload may differ), and would run as a new operation.
            raise ValueError("they would not come back the same from JSON")
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"recover=True keeps a call's arguments as JSON, for the sweep to call it again, and "
            f"these are not: {exc}. Pass ids and plain values (lists, not tuples)."
        ) from exc
    return dumped.encode()


def is_failed(scope: Scope) -> bool:
    """Whether the call with this scope was given up by the sweep."""
    scoped = kept_calls().filter(namespace=scope.namespace, owner=scope.owner, key=scope.key)
    return bool(scoped.filter(state=FAILED).exists())


def kept_calls() -> QuerySet[RecoverableOperation]:
    """The calls kept, on the records' database (IDEMPOTENCY_DATABASE, or the router's)."""
    from django_idempotency.models import RecoverableOperation
    from django_idempotency.stores.database import records_alias

    return RecoverableOperation._default_manager.using(records_alias(RecoverableOperation))
