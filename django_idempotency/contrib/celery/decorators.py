"""`@idempotent_task`: a Celery task whose body runs once per key, by default its message id."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

from celery import current_task, shared_task  # type: ignore[import-untyped]

from django_idempotency.conf import Mode, OnConflict, conf
from django_idempotency.core.outcomes import Scope
from django_idempotency.exceptions import KeyInProgress
from django_idempotency.functions import (
    ArgumentPicker,
    CallArguments,
    RunOptions,
    lazy_serializer,
    namespace_of,
    run_once,
)
from django_idempotency.recoverable import TASK, encoded, recoverable
from django_idempotency.results import ResultSerializer


def idempotent_task(
    *,
    key: ArgumentPicker | None = None,
    namespace: str | None = None,
    ttl: timedelta | float | None = None,
    payload: ArgumentPicker | Sequence[str] | None = None,
    owner: ArgumentPicker | None = None,
    mode: Mode | None = None,
    on_conflict: OnConflict = "wait",
    serializer: ResultSerializer | None = None,
    lease: timedelta | float | None = None,
    recover: bool = False,
    app: Any = None,
    **task_options: Any,
) -> Callable[[Callable[..., Any]], Any]:
    """Declare a Celery task (``app.task``, or ``shared_task``) whose body runs once per key.

    The key is the message's task id by default, so a redelivered message (``acks_late``, a lost
    worker) returns the stored result without running the body; ``key`` picks one from the
    task's arguments instead (a parameter's name, or a callable taking them). A retry of the
    same message is not a duplicate of itself: a failed attempt releases the key. A duplicate
    that finds the first attempt still running waits (``on_conflict``) and then retries the
    task after its lease (``lease``, default ``IDEMPOTENCY_LEASE``; in lease mode renewed while
    the body runs). ``recover=True``: the call's arguments are kept while it runs, and
    `recovery.recover_operations` runs it again (with the same task id) if its lease ends
    without it completing. Other keyword arguments are the task's own options.
    """
    bind = bool(task_options.get("bind", False))
    # Checked now, where the decorator is declared, not at the first run.
    declared = RunOptions(
        ttl=ttl, mode=mode, on_conflict=on_conflict, serializer=serializer, lease=lease
    )

    def decorate(func: Callable[..., Any]) -> Any:
        name = task_options.get("name") or f"{func.__module__}.{func.__name__}"
        keys_namespace = namespace_of(namespace, name, "@idempotent_task")
        arguments = CallArguments(func, key=key, owner=owner, payload=payload, skip_first=bind)

        def scope_of(args: list[Any], kwargs: dict[str, Any], task_id: str | None) -> Scope:
            return arguments.call(keys_namespace, name, "TASK", args, kwargs, task_id).scope

        recovery = recoverable(TASK, name, scope_of, mode=mode, qualname=name) if recover else None
        options = replace(declared, recover=recovery)
        result_format = lazy_serializer(func, serializer)

        @functools.wraps(func)
        def body(*args: Any, **kwargs: Any) -> Any:
            task = args[0] if bind else current_task
            task_id = task.request.id
            if not conf.ENABLED or (key is None and task_id is None):
                # Called as a plain function: no message, so nothing can be delivered twice.
                return func(*args, **kwargs)
            call_args = args[1:] if bind else args
            call = arguments.call(
                keys_namespace, name, "TASK", call_args, kwargs, default_key=task_id
            )
            kept = None if recovery is None else encoded(call_args, kwargs, task_id)
            try:
                return run_once(call, lambda: func(*args, **kwargs), options, result_format(), kept)
            except KeyInProgress as exc:
                # The first attempt still runs (or its worker died holding a lease): look again
                # once that lease can have run out; counted against the task's max_retries.
                raise task.retry(countdown=options.lease_length.total_seconds(), exc=exc) from exc

        declare = shared_task if app is None else app.task
        return declare(name=name, **{k: v for k, v in task_options.items() if k != "name"})(body)

    return decorate
