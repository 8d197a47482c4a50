"""The request flow around a view: claim the key, run the view once, store or release."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from asgiref.sync import sync_to_async
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.db import DatabaseError
from django.http import HttpResponse, UnreadablePostError
from django.http.multipartparser import MultiPartParserError
from django.http.request import HttpHeaders
from django.http.response import HttpResponseBase
from django.utils import timezone

from django_idempotency.attempts import Attempt
from django_idempotency.conf import conf
from django_idempotency.core.fingerprint import UnreadableBody
from django_idempotency.core.keys import MAX_OWNER_LENGTH, InvalidKey, parse_key
from django_idempotency.core.outcomes import Outcome, Scope
from django_idempotency.core.policy import should_store
from django_idempotency.exceptions import DeliveryRejected
from django_idempotency.http import problems
from django_idempotency.http.options import Options, Resolved, resolve
from django_idempotency.http.requests import SAFE_METHODS, django_request
from django_idempotency.http.responses import capture, replay
from django_idempotency.stores import ClaimRequest, StoreUnavailable
from django_idempotency.stores.connections import on_a_live_connection

logger = logging.getLogger("django_idempotency")

Finalize = Callable[[HttpResponseBase], HttpResponseBase]


class Guard:
    """One request's passage through the claim state machine.

    `prepare` answers the request itself (replay, 409, 422, 400, 503) or claims the key; the
    caller then runs the view and hands its response to `finish`. Used as a context manager it
    holds atomic mode's transaction open around all three, and gives the key back if the view
    raised.
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
        self.attempt: Attempt | None = None

    def __enter__(self) -> Guard:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.attempt is not None:  # Claimed: commit, or release and roll back on an error.
            self.attempt.__exit__(exc_type, exc, tb)

    def prepare(self) -> HttpResponseBase | None:
        """A response to send instead of running the view, or None once the key is claimed."""
        http_request = django_request(self.request)
        if http_request.method in SAFE_METHODS:
            return None
        settings = resolve(self.options, self.view)
        if settings.verify is not None:
            try:
                settings.verify(self.request)
            except DeliveryRejected as exc:
                return problems.problem_response(problems.DELIVERY_REJECTED, str(exc))
        # From META: building `request.headers` would parse every header to read this one.
        raw_key = http_request.META.get(HttpHeaders.to_wsgi_name(settings.header))
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
        except BODY_ERRORS as exc:
            return body_problem(exc)
        try:
            # Loading the session or the user may be the request's first query.
            owner = on_a_live_connection(lambda: conf.OWNER_RESOLVER(self.request))
        except DatabaseError as exc:
            logger.error("The request's owner could not be loaded: %s", exc)
            return _unavailable()
        if len(owner) > MAX_OWNER_LENGTH or "\x00" in owner:
            return problems.problem_response(
                problems.INVALID_OWNER,
                f"The request's owner (from IDEMPOTENCY_OWNER_RESOLVER) must be at most "
                f"{MAX_OWNER_LENGTH} characters without NUL bytes: fix what identifies you.",
            )
        scope = Scope(settings.namespace, owner, key)
        return self._claim(settings, scope, request_fingerprint, http_request.get_full_path())

    def _claim(
        self, settings: Resolved, scope: Scope, request_fingerprint: str, path: str
    ) -> HttpResponseBase | None:
        attempt = self.attempt = Attempt(
            atomic=settings.mode == "atomic" and not self.force_lease,
            on_conflict=settings.on_conflict,
        )
        claim_request = ClaimRequest(
            scope=scope,
            fingerprint=request_fingerprint,
            method=django_request(self.request).method or "",
            path=path,
            now=timezone.now(),
            ttl=settings.ttl,
            lease=None if attempt.atomic else conf.LEASE,
        )
        try:
            claim = attempt.begin(claim_request)
        except StoreUnavailable as exc:
            logger.error("Idempotency store unreachable: %s", exc)
            return _unavailable()
        outcome = claim.outcome
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

    def finish(self, response: HttpResponseBase) -> HttpResponseBase:
        """Store the view's response, or release the key when it means nothing happened."""
        attempt = self.attempt
        if attempt is None or attempt.claim is None:
            return response
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
            attempt.release(rollback=False)  # The view did its work; only the claim goes.
            return response
        if not should_store(
            stored.status,
            stored_client_errors=conf.STORED_CLIENT_ERRORS,
            store_server_errors=conf.STORE_SERVER_ERRORS,
        ):
            attempt.release()  # Nothing happened: the view's writes go with the claim.
            return response
        try:
            attempt.complete(stored)
        except StoreUnavailable as exc:
            if attempt.atomic:  # The transaction holding the view's writes is lost with it.
                return _unavailable()
            logger.error("The response could not be stored: %s", exc)
        except Exception:
            if attempt.atomic:  # The view's writes roll back with the claim: nothing happened.
                raise
            # Lease mode: the view's work is done; the client gets its answer, and the key was
            # given back so that a retry is not held off until the lease ends.
            logger.exception("The response could not be stored; the key was released")
        return response

    def abort(self) -> None:
        """The view raised: give the key back."""
        if self.attempt is not None:
            self.attempt.abort()


# What reading a body for its fingerprint may raise, all of them the client's to correct.
BODY_ERRORS = (
    RequestDataTooBig,
    TooManyFieldsSent,
    MultiPartParserError,
    UnreadablePostError,
    UnreadableBody,
)


def body_problem(exc: Exception) -> HttpResponse:
    """The problem answering a body that cannot be read or compared (one of BODY_ERRORS)."""
    if isinstance(exc, RequestDataTooBig):
        return problems.problem_response(
            problems.REQUEST_TOO_LARGE, "The request body exceeds the server's upload limit."
        )
    if isinstance(exc, TooManyFieldsSent):
        return problems.problem_response(
            problems.MALFORMED_REQUEST,
            "The request has more form fields than the server accepts: send fewer.",
        )
    return problems.problem_response(problems.MALFORMED_REQUEST, str(exc))


def _unavailable() -> HttpResponse:
    return problems.problem_response(
        problems.STORE_UNAVAILABLE,
        "The idempotency store cannot be reached, so the request was not run: retry later.",
        retry_after=5,
    )


def _store_lost(guard: Guard) -> bool:
    """The view raised and its key could not even be released: the store's database is gone,
    most likely why the view failed (in lease mode its queries run outside the guard's
    transaction). Such a failure is answered as for a lost store; the claim ends with its lease.
    """
    if guard.attempt is None or not guard.attempt.store_lost:
        return False
    logger.error("The view failed while the idempotency store was unreachable", exc_info=True)
    return True


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
    guard = Guard(request, options, view, finalize)
    try:
        with guard:
            early = guard.prepare()
            if early is not None:
                return early
            return guard.finish(call())
    except StoreUnavailable:
        # Atomic mode: the commit (or the view's own queries) lost the database; nothing was kept.
        return _unavailable()
    except Exception:
        if not _store_lost(guard):
            raise
        return _unavailable()


async def run_async(
    call: Callable[[], Awaitable[HttpResponseBase]],
    request: Any,
    options: Options,
    view: Any = None,
) -> HttpResponseBase:
    """Guard an async view. A transaction cannot stay open across awaits, so it runs leased.

    A client that disconnects gets its view task cancelled by the server; the view may already
    have done its work, so it is shielded: it runs on and stores its response, and the retry
    gets 409 and then the replay, as it would from a synchronous view.
    """
    if not conf.ENABLED:
        return await call()
    guard = Guard(request, options, view, force_lease=True)
    early = await sync_to_async(guard.prepare)()
    if early is not None:
        return early
    task = asyncio.ensure_future(_run_guarded(call, guard))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        _detached.add(task)  # Keep a reference until it ends, or it may be collected mid-run.
        task.add_done_callback(_detached.discard)
        raise


# Guarded views whose caller was cancelled (the client left), still running to completion.
_detached: set[asyncio.Future[HttpResponseBase]] = set()


async def _run_guarded(
    call: Callable[[], Awaitable[HttpResponseBase]], guard: Guard
) -> HttpResponseBase:
    try:
        response = await call()
    except BaseException as exc:
        await sync_to_async(guard.abort)()
        if not isinstance(exc, Exception) or not _store_lost(guard):
            raise
        return _unavailable()
    return await sync_to_async(guard.finish)(response)
