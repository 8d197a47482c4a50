"""Errors raised to Python callers of idempotent functions, tasks and webhook verifiers."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError


class IdempotencyError(Exception):
    """Base class of every error this package raises on purpose."""


class StoreUnavailable(IdempotencyError):
    """The store cannot be reached; the work is refused rather than run unprotected."""


class PurgeConflict(StoreUnavailable):
    """A purge batch was refused a row lock (a lock wait timeout, or a deadlock the database
    broke) and rolled back: the database is there, so the purge can simply run again. A
    `StoreUnavailable` so that the command, the task and the admin stop it the same way."""


class KeyInProgress(IdempotencyError):
    """Another call with the same key is still running: try again once it has finished."""


class LeaseLost(IdempotencyError):
    """The work's claim was taken over (its lease ran out) or has already ended: stop before the
    next side effect, whose result the new owner of the key would not know of."""


class StepAmbiguous(IdempotencyError):
    """A step run at most once was started by an earlier attempt that never finished it: it is
    not run again until an operator says whether it happened (`steps.resolve_step`)."""

    def __init__(self, step: str, message: str) -> None:
        super().__init__(message)
        self.step = step


class KeyMismatch(IdempotencyError):
    """The key was already used with a different payload: use a new key for new work."""


class ResultNotStored(IdempotencyError):
    """The call already ran with this key, but the store refused its result: it is not run
    again, and its result cannot be returned; read its effects instead."""


class DeliveryRejected(IdempotencyError):
    """A webhook delivery failed verification (forged, stale or malformed); nothing was stored."""


class StoreNotSupported(StoreUnavailable):
    """The store cannot run where it is used (a database it does not support, the memory store in
    a second process): a deployment error, not an outage. The message says what to do."""


class AppNotInstalled(IdempotencyError, ImproperlyConfigured, CommandError):
    """ "django_idempotency" is missing from INSTALLED_APPS while something needs it (a decorated
    view, the mixin, the middleware, a function on the database store).

    An `ImproperlyConfigured`, which callers catch, and a `CommandError`: raised as `manage.py
    check` or `runserver` imports the URLconf, where the app's checks are not registered, it is
    printed as its one sentence with the fix rather than under a traceback."""
