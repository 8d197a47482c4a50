"""The request flow around a view: claim the key, run the view once, store or release."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from types import TracebackType
from typing import Any

from asgiref.sync import sync_to_async
from django.core.exceptions import RequestDataTooBig
from django.http import HttpResponse, UnreadablePostError
from django.http.multipartparser import MultiPartParserError
from django.http.response import HttpResponseBase
from django.utils import timezone

from django_idempotency.conf import conf
from django_idempotency.core.keys import InvalidKey, parse_key
from django_idempotency.core.outcomes import Claim, Outcome, Scope
from django_idempotency.core.policy import should_store
from django_idempotency.http import problems
from django_idempotency.http.options import Options, Resolved, resolve
from django_idempotency.http.requests import SAFE_METHODS, django_request
from django_idempotency.http.responses import capture, replay
from django_idempotency.stores import BaseStore, ClaimRequest, StoreUnavailable, get_store

logger = logging.getLogger("django_idempotency")

Finalize = Callable[[HttpResponseBase], HttpResponseBase]


class Guard:
    """One request's passage through the claim state machine.

    `prepare` answers the request itself (replay, 409, 422, 400, 503) or claims the key; the
    caller then runs the view and hands its response to `finish`, or calls `abort` if it raised.
    Used as a context manager it holds atomic mode's transaction open around all three.
    """

    def __init__(
        self,
        request: Any,
        options: Options,
        view: Any = None,
        finalize: Finalize | None = None,
        *,
        force_lease: bool = False,
    ) -> None:
        self.request = request
        self.options = options
        self.view = view
        self.finalize = finalize
        self.force_lease = force_lease
        self.store: BaseStore | None = None
        self.claim: Claim | None = None
        self.atomic = False
        self.owns_transaction = False  # Atomic mode opened its own: a rollback undoes the view.
        self._transaction = contextlib.ExitStack()

    def __enter__(self) -> Guard:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None and not self.owns_transaction:
            self.abort()
        self._transaction.__exit__(exc_type, exc, tb)  # Commits, or rolls back on an error.

    def prepare(self) -> HttpResponseBase | None:
        """A response to send instead of running the view, or None once the key is claimed."""
        http_request = django_request(self.request)
        if http_request.method in SAFE_METHODS:
            return None
        settings = resolve(self.options, self.view)
        raw_key = http_request.headers.get(settings.header)
        if raw_key is None:
            if settings.required:
                return problems.problem_response(
                    problems.MISSING_KEY,
                    f"This endpoint requires an {settings.header} header: send a new unique"
                    " value (a UUID or ULID) with each distinct request.",
                )
            return None
        try:
            key = parse_key(raw_key, conf.KEY_FORMAT)
        except InvalidKey as exc:
            return problems.problem_response(problems.INVALID_KEY, str(exc))
        try:
            request_fingerprint = conf.FINGERPRINT(self.request)
        except RequestDataTooBig:
            return problems.problem_response(
                problems.REQUEST_TOO_LARGE, "The request body exceeds the server's upload limit."
            )
        except (MultiPartParserError, UnreadablePostError) as exc:
            return problems.problem_response(problems.MALFORMED_REQUEST, str(exc))
        scope = Scope(settings.namespace, conf.OWNER_RESOLVER(self.request), key)
        return self._claim(settings, scope, request_fingerprint, http_request.get_full_path())

    def _claim(
        self, settings: Resolved, scope: Scope, request_fingerprint: str, path: str
    ) -> HttpResponseBase | None:
        store = self.store = get_store()
        self.atomic = settings.mode == "atomic" and store.supports_atomic and not self.force_lease
        claim_request = ClaimRequest(
            scope=scope,
            fingerprint=request_fingerprint,
            method=django_request(self.request).method or "",
            path=path,
            now=timezone.now(),
            ttl=settings.ttl,
            lease=None if self.atomic else conf.LEASE,
        )
        try:
            claim = self.claim = self._begin(store, claim_request, settings)
        except StoreUnavailable as exc:
            logger.error("Idempotency store unreachable: %s", exc)
            return _unavailable()
        outcome = claim.outcome
        logger.debug("idempotency %s namespace=%s", outcome.value, scope.namespace)
        if outcome is Outcome.FRESH:
            return None
        if outcome is Outcome.REPLAY:
            assert claim.response is not None
            return replay(claim.response)
        if outcome is Outcome.MISMATCH:
            return problems.problem_response(
                problems.KEY_REUSED,
                "This key was already used for a different request (method, path or body "
                "differ): send a new key for a new request.",
            )
        return problems.problem_response(
            problems.IN_PROGRESS,
            "A request with this key is still being processed: retry after a moment.",
            retry_after=1,
        )

    def _begin(self, store: BaseStore, claim_request: ClaimRequest, settings: Resolved) -> Claim:
        """Claim the key; with on_conflict="wait", retry with backoff until the deadline."""
        cached = store.lookup(claim_request)
        if cached is not None:
            return cached  # A replay (or mismatch) without opening a transaction.
        deadline = time.monotonic() + conf.WAIT_TIMEOUT.total_seconds()
        delay = 0.01
        while True:
            if self.atomic:
                self.owns_transaction = self._transaction.enter_context(store.atomic())
            claim = store.begin(claim_request)
            remaining = deadline - time.monotonic()
            if claim.outcome is not Outcome.IN_PROGRESS or settings.on_conflict != "wait":
                return claim
            if remaining <= 0:
                return claim
            # Hold no transaction while waiting: the first request may need to finish its own.
            self._transaction.close()
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.25)
            claim_request = replace(claim_request, now=timezone.now())

    def finish(self, response: HttpResponseBase) -> HttpResponseBase:
        """Store the view's response, or release the key when it means nothing happened."""
        if self.claim is None or self.store is None:
            return response
        claim, store, self.claim = self.claim, self.store, None
        if self.finalize is not None:
            response = self.finalize(response)
        render = getattr(response, "render", None)
        if callable(render):
            response = render() or response
        stored = capture(response)
        if stored is None:
            logger.warning(
                "A streaming response cannot be stored; the idempotency key was released."
            )
            _quietly(store.release, claim)
            return response
        if not should_store(
            stored.status,
            stored_client_errors=conf.STORED_CLIENT_ERRORS,
            store_server_errors=conf.STORE_SERVER_ERRORS,
        ):
            if self.owns_transaction:
                store.discard()  # Nothing happened: roll back the view's writes with the claim.
            else:
                _quietly(store.release, claim)
            return response
        try:
            kept = store.complete(claim, stored, timezone.now())
        except StoreUnavailable as exc:
            if self.atomic:  # The transaction holding the view's writes is lost with it.
                if self.owns_transaction:
                    store.discard()
                return _unavailable()
            logger.error("The response could not be stored: %s", exc)
            return response
        if not kept:
            logger.warning(
                "The lease expired and another request took the key over; this response was "
                "not stored. Raise IDEMPOTENCY_LEASE above the view's longest run."
            )
        return response

    def abort(self) -> None:
        """The view raised: give the key back (a rollback of our own transaction does that)."""
        claim, self.claim = self.claim, None
        if claim is not None and self.store is not None and not self.owns_transaction:
            _quietly(self.store.release, claim)


def _unavailable() -> HttpResponse:
    return problems.problem_response(
        problems.STORE_UNAVAILABLE,
        "The idempotency store cannot be reached, so the request was not run: retry later.",
        retry_after=5,
    )


def _quietly(action: Callable[[Claim], bool], claim: Claim) -> None:
    """Release on a failure path: never mask the error that got us here."""
    try:
        action(claim)
    except Exception as exc:  # An aborted transaction or a lost store: the lease will expire.
        logger.error("Could not release an idempotency claim: %s", exc)


def run(
    call: Callable[[], HttpResponseBase],
    request: Any,
    options: Options,
    view: Any = None,
    finalize: Finalize | None = None,
) -> HttpResponseBase:
    """Guard a synchronous view call."""
    if not conf.ENABLED:
        return call()
    try:
        with Guard(request, options, view, finalize) as guard:
            early = guard.prepare()
            if early is not None:
                return early
            return guard.finish(call())
    except StoreUnavailable:
        # Atomic mode: the commit (or the view's own queries) lost the database; nothing was kept.
        return _unavailable()


async def run_async(
    call: Callable[[], Awaitable[HttpResponseBase]],
    request: Any,
    options: Options,
    view: Any = None,
) -> HttpResponseBase:
    """Guard an async view. A transaction cannot stay open across awaits, so it runs leased."""
    if not conf.ENABLED:
        return await call()
    guard = Guard(request, options, view, force_lease=True)
    early = await sync_to_async(guard.prepare)()
    if early is not None:
        return early
    try:
        response = await call()
    except BaseException:
        await sync_to_async(guard.abort)()
        raise
    return await sync_to_async(guard.finish)(response)
