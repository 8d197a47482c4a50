"""The request flow around a view: claim the key, run the view once, store or release."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError, ProgrammingError, close_old_connections
from django.http import HttpRequest
from django.http.request import HttpHeaders
from django.http.response import HttpResponseBase

from django_idempotency.attempts import FIRST_DELAY, Attempt, next_delay, restore_current_attempt
from django_idempotency.conf import conf, require_installed
from django_idempotency.core.keys import MAX_OWNER_LENGTH, InvalidKey, parse_key
from django_idempotency.core.outcomes import Outcome, Scope
from django_idempotency.core.policy import should_store
from django_idempotency.encryption import UnreadableResponse, UnreadableStep
from django_idempotency.exceptions import (
    DeliveryRejected,
    LeaseLost,
    StepAmbiguous,
    StoreNotSupported,
)
from django_idempotency.http import forms, problems
from django_idempotency.http.credentials import answers_credentials
from django_idempotency.http.options import Options, Resolved, resolve
from django_idempotency.http.owners import OwnerUnknown

# Defined in problems.py now; still importable from here, where they were.
from django_idempotency.http.problems import BODY_ERRORS as BODY_ERRORS
from django_idempotency.http.problems import body_problem as body_problem
from django_idempotency.http.requests import SAFE_METHODS, django_request
from django_idempotency.http.responses import capture, replay, sent_then, without_body
from django_idempotency.stores import StoreUnavailable, get_store
from django_idempotency.stores.base import until_sent
from django_idempotency.stores.connections import on_a_live_connection

logger = logging.getLogger("django_idempotency")

# What the view's framework does to its response once the view returns (see `http.frameworks`):
# done before the response is stored, so that the stored bytes are the ones sent.
Finalize = Callable[[HttpResponseBase], HttpResponseBase]


class Guard(contextlib.ExitStack):
    """One request's passage through the claim state machine.

    `prepare` answers the request itself (replay, 409, 422, 400, 503) or claims the key; the
    caller then runs the view and hands its response to `finish`. Used as a context manager it
    holds atomic mode's transaction open around all three, and gives the key back if the view
    raised: leaving it leaves the `Attempt` that `prepare` entered.
    """

    def __init__(
        self,
        request: Any,
        options: Options,
        view: Any = None,
        finalize: Finalize | None = None,
        *,
        force_lease: bool = False,
        poll: bool = False,
    ) -> None:
        self.request = request  # As the view gets it: what IDEMPOTENCY_* callables are given.
        self.http_request = django_request(request)
        self.options = options
        self.view = view
        self.finalize = finalize
        self.force_lease = force_lease
        self.poll = poll  # An async caller: it does any waiting itself (see `run_async`).
        self.may_wait = False  # The key is in progress, and the view waits for it.
        self.from_form = False  # The key came in a form's field, not in the header.
        self.attempt: Attempt | None = None
        self.settings: Resolved | None = None  # The options in force, once `prepare` read them.
        super().__init__()

    def prepare(self) -> HttpResponseBase | None:
        """A response to send instead of running the view, or None once the key is claimed."""
        http_request = self.http_request
        if http_request.method in SAFE_METHODS:
            return None
        settings = self.settings = resolve(self.options, self.view)
        if settings.verify is not None:
            try:
                settings.verify(self.request)
            except DeliveryRejected as exc:
                return problems.problem_response(problems.DELIVERY_REJECTED, str(exc))
        # From META: building `request.headers` would parse every header to read this one.
        raw_key = http_request.META.get(HttpHeaders.to_wsgi_name(settings.header))
        if raw_key is None:
            try:
                raw_key = forms.form_key(http_request)
            except problems.BODY_ERRORS as exc:
                return problems.body_problem(exc)
            self.from_form = raw_key is not None
        if raw_key is None:
            if not settings.required:
                return None
            if conf.FORM_FIELD is not None and forms.is_form_post(http_request):
                return problems.problem_response(
                    problems.MISSING_KEY,
                    "This form cannot be sent safely: it carries no idempotency key. Its page"
                    f" must render {forms.TAG} inside the <form> (or its form class use"
                    " IdempotentFormMixin).",
                )
            return problems.problem_response(
                problems.MISSING_KEY,
                f"This endpoint requires an {settings.header} header: send a new unique"
                " value (a UUID or ULID) with each distinct request.",
            )
        try:
            key = parse_key(raw_key, conf.KEY_FORMAT)
        except InvalidKey as exc:
            return problems.problem_response(problems.INVALID_KEY, str(exc))
        try:
            request_fingerprint = conf.FINGERPRINT(self.request)
        except problems.FINGERPRINT_ERRORS as exc:
            return problems.body_problem(exc)
        owner = request_owner(self.request)
        if not isinstance(owner, str):
            return owner
        scope = Scope(settings.namespace, owner, key)
        # The path without its query string: the fingerprint decides whether the query matters
        # (the default one includes it), the path only keeps one endpoint from answering another.
        return self._claim(settings, scope, request_fingerprint, http_request.path)

    def _claim(
        self, settings: Resolved, scope: Scope, request_fingerprint: str, path: str
    ) -> HttpResponseBase | None:
        # The store first: every store but the memory store answers at once, on the hot path.
        if not get_store().shared_between_processes and several_processes(self.http_request):
            return problems.unusable_store(StoreNotSupported(_one_process_store()))
        # A person's second click waits for the first and gets its answer: a browser shows a
        # 409 as a dead end.
        on_conflict = "wait" if self.from_form else settings.on_conflict
        # An async view waits for a running duplicate itself, between tries of its own; one that
        # does not wait is answered (and its conflict announced) at once.
        polls = self.poll and on_conflict == "wait"
        attempt = Attempt(
            atomic=settings.mode == "atomic" and not self.force_lease,
            on_conflict=on_conflict,
            request=self.http_request,
            poll=polls,
        )
        # Leaving the guard leaves the attempt: commit, or release and roll back on an error.
        self.attempt = self.enter_context(attempt)
        try:
            claim = attempt.claim_key(
                scope,
                request_fingerprint,
                method=self.http_request.method or "",
                path=path,
                ttl=settings.ttl,
                lease=settings.lease,
            )
        except STORE_FAILURES as exc:
            return answer_store_failure(exc)
        outcome = claim.outcome
        if outcome is Outcome.FRESH:
            return None
        if outcome is Outcome.REPLAY:
            assert claim.response is not None
            return replay(claim.response)
        if outcome is Outcome.MISMATCH:
            return problems.problem_response(
                problems.KEY_REUSED,
                "This form was already sent with other data. Reload its page for a fresh form,"
                " then send it again."
                if self.from_form
                else "This key was already used for a different request (method, path or body "
                "differ): send a new key for a new request.",
            )
        self.may_wait = polls
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
        # A TemplateResponse renders after the view, where Django's handler checks just so.
        render = getattr(response, "render", None)
        if callable(render):
            response = render() or response
        if attempt.changed_nothing and response.status_code // 100 != 3:
            # Its form was invalid (IdempotentFormMixin), and shown again with the same key for
            # the corrected form to run with: a redirect would say the work was done. Only the
            # claim goes: what the view wrote for that answer is kept, as Django keeps a 200's.
            attempt.release(rollback=False)
            return response
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
        if self._answers_credentials():
            # A token kept for replays would sit at rest for the whole TTL, and a retry is safe
            # to run again: it presents the credentials once more and is answered afresh.
            attempt.release(rollback=False)  # The view did its work; only the claim goes.
            return response
        limit = conf.MAX_STORED_BYTES
        if limit is not None and len(stored.body) > limit:
            # Releasing the key would let a retry run the view again: keep the outcome instead.
            logger.warning(
                "A response body of %d bytes is over IDEMPOTENCY_MAX_STORED_BYTES (%d): its "
                "status and headers were stored without it, and retries get 410 "
                "response-not-stored.",
                len(stored.body),
                limit,
            )
            stored = without_body(stored)
        try:
            attempt.complete(stored, smaller=without_body)
        except StoreUnavailable as exc:
            if attempt.atomic:  # The transaction holding the view's writes is lost with it.
                return problems.store_unavailable()
            logger.error("The response could not be stored: %s", exc)
        except Exception:
            if attempt.atomic:  # The view's writes roll back with the claim: nothing happened.
                raise
            # Lease mode: the view's work is done, and the client gets its answer. Not even a
            # record that it ran could be stored: the claim ends with its lease (never given
            # back sooner, which would let a retry run the view again at once).
            logger.exception("The response could not be stored, nor a record that it ran")
        return response

    def _answers_credentials(self) -> bool:
        settings = self.settings
        assert settings is not None
        match = self.http_request.resolver_match
        route = None if match is None else match.func
        return answers_credentials(settings.credentials, self.view, route)

    def abort(self) -> None:
        """The view raised: give the key back."""
        if self.attempt is not None:
            self.attempt.abort()


def several_processes(request: HttpRequest) -> bool:
    """Whether the WSGI server says other processes serve the site too (PEP 3333's
    `wsgi.multiprocess`: gunicorn with more than one worker, uWSGI with several processes).

    An ASGI request carries no such word, and runserver says False. Django's RequestFactory and
    test client say True whatever runs the test: their body, a FakePayload, tells them apart.
    """
    if not request.META.get("wsgi.multiprocess"):
        return False
    test_client = sys.modules.get("django.test.client")  # Never imported just to ask.
    return test_client is None or not isinstance(
        request.META.get("wsgi.input"), test_client.FakePayload
    )


def _one_process_store() -> str:
    return (
        f"IDEMPOTENCY_STORE = {conf.STORE!r} keeps its records in the memory of one process, and"
        " this server runs several worker processes (its WSGI environ says wsgi.multiprocess):"
        " a retry reaching another worker would run the view again. Use the database store (the"
        " default) or django_idempotency.stores.redis.RedisStore, or serve with one worker"
        " process."
    )


def _taken_over(exc: LeaseLost) -> HttpResponseBase:
    """The view stopped at its next side effect because its claim was taken over: the request
    now holding the key does the work, and this client's retry gets its answer."""
    logger.warning("A guarded view stopped: %s", exc)
    return problems.lease_lost()


def _unreadable_step(exc: UnreadableStep) -> HttpResponseBase:
    """A resumed step's stored result could not be opened here: answered as a stored response
    that cannot be opened is, the step not run again. Its record keeps the steps, its lease
    ended, so that a retry reaching a server with the key resumes after them."""
    logger.error("A guarded view could not resume its stored steps: %s", exc)
    return problems.step_not_decryptable()


def _ambiguous(exc: StepAmbiguous) -> HttpResponseBase:
    """An at-most-once step was interrupted: not run again, the record kept for an operator."""
    logger.error("A guarded view did not resume: %s", exc)
    return problems.step_ambiguous(exc.step)


def _store_lost(guard: Guard) -> bool:
    """The view raised and its key could not even be released: the store's database is gone,
    most likely why the view failed (in lease mode its queries run outside the guard's
    transaction). Such a failure is answered as for a lost store; the claim ends with its lease.
    """
    if guard.attempt is None or not guard.attempt.store_lost:
        return False
    logger.error("The view failed while the idempotency store was unreachable", exc_info=True)
    return True


# Set on the HttpRequest by the first guard that meets it.
_GUARDED = "_idempotency_guarded"


def _first_guard(request: Any) -> bool:
    """Mark the request as guarded; False if it already was. One request is guarded once: the
    guard that meets it first holds its key, and any guard inside it (a decorated method a
    guarded handler calls) passes it through, rather than find its own key in progress."""
    http_request = django_request(request)
    if getattr(http_request, _GUARDED, False):
        return False
    setattr(http_request, _GUARDED, True)
    return True


def run(
    call: Callable[[], HttpResponseBase],
    request: Any,
    options: Options,
    view: Any = None,
    finalize: Finalize | None = None,
) -> HttpResponseBase:
    """Guard a synchronous view call; one another guard already holds runs as it is."""
    if not conf.ENABLED or not _first_guard(request):
        return call()
    require_installed()
    with until_sent() as pending:
        response = _run(call, request, options, view, finalize)
    return sent_then(_for_client(response, request), pending)


def _run(
    call: Callable[[], HttpResponseBase],
    request: Any,
    options: Options,
    view: Any,
    finalize: Finalize | None,
) -> HttpResponseBase:
    guard = Guard(request, options, view, finalize)
    try:
        with guard:
            early = guard.prepare()
            if early is not None:
                return early
            return guard.finish(call())
    except LeaseLost as exc:
        return _taken_over(exc)
    except UnreadableStep as exc:
        return _unreadable_step(exc)
    except StepAmbiguous as exc:
        return _ambiguous(exc)
    except StoreUnavailable:
        # Atomic mode: the commit (or the view's own queries) lost the database; nothing was kept.
        return problems.store_unavailable()
    except Exception:
        if not _store_lost(guard):
            raise
        return problems.store_unavailable()


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
    if not conf.ENABLED or not _first_guard(request):
        return await call()
    require_installed()
    with until_sent() as pending:
        response = await _run_async(call, request, options, view)
    return sent_then(_for_client(response, request), pending)


def _for_client(response: HttpResponseBase, request: Any) -> HttpResponseBase:
    """The guard's own problem as a page for a browser that asks for HTML; a framework's
    request (DRF's, which renders its own errors) gets it as it is."""
    if not isinstance(request, HttpRequest):
        return response
    return forms.for_client(response, request)


async def _run_async(
    call: Callable[[], Awaitable[HttpResponseBase]], request: Any, options: Options, view: Any
) -> HttpResponseBase:
    # The claim, made through sync_to_async, makes its attempt current here too; the view runs
    # and ends it in a task of its own, whose context this one does not see: leave it here.
    with restore_current_attempt():
        guard = Guard(request, options, view, force_lease=True, poll=True)
        early = await sync_to_async(guard.prepare)()
        if guard.may_wait:
            guard, early = await _wait(guard, early)
        if early is not None:
            return early
        task = asyncio.ensure_future(_run_guarded(call, guard))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            outliving = asyncio.ensure_future(_outlive_the_request(task))
            _detached.add(outliving)  # A reference until it ends, or it may be collected mid-run.
            outliving.add_done_callback(_detached.discard)
            raise


# What a store may raise claiming or reading a key that a problem answers (`answer_store_failure`).
STORE_FAILURES = (StoreUnavailable, ProgrammingError, UnreadableResponse)


def answer_store_failure(exc: Exception) -> HttpResponseBase:
    """The problem answering one of STORE_FAILURES; a ProgrammingError other than a missing
    table (which PostgreSQL reports so, SQLite as unreachable) is raised again."""
    if isinstance(exc, UnreadableResponse):
        logger.error("A stored response could not be replayed: %s", exc)
        return problems.not_decryptable(exc.status)
    answer = problems.unusable_store(exc if isinstance(exc, StoreUnavailable) else None)
    if answer is None:
        raise exc
    return answer


def request_owner(request: Any) -> str | HttpResponseBase:
    """Who the request's key belongs to (IDEMPOTENCY_OWNER_RESOLVER), or the problem that
    answers a request whose owner cannot be told."""
    try:
        # Loading the session or the user may be the request's first query.
        owner: str = on_a_live_connection(lambda: conf.OWNER_RESOLVER(request))
    except DatabaseError as exc:
        logger.error("The request's owner could not be loaded: %s", exc)
        return problems.store_unavailable()
    except OwnerUnknown as exc:
        logger.error("Request owner unknown: %s", exc)
        return problems.owner_unknown()
    if len(owner) > MAX_OWNER_LENGTH or "\x00" in owner:
        return problems.problem_response(
            problems.INVALID_OWNER,
            f"The request's owner (from IDEMPOTENCY_OWNER_RESOLVER) must be at most "
            f"{MAX_OWNER_LENGTH} characters without NUL bytes: fix what identifies you.",
        )
    return owner


async def _wait(guard: Guard, early: HttpResponseBase | None) -> tuple[Guard, Any]:
    """on_conflict="wait" in an async view: try again with backoff until the deadline, sleeping
    with asyncio.sleep: a blocking sleep would hold Django's one shared sync thread, and with it
    every other request's sync_to_async calls."""
    started = time.perf_counter()
    deadline = time.monotonic() + conf.WAIT_TIMEOUT.total_seconds()
    delay = FIRST_DELAY
    while guard.may_wait:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            assert guard.attempt is not None
            await sync_to_async(guard.attempt.announce_conflict)(time.perf_counter() - started)
            break
        await asyncio.sleep(min(delay, remaining))
        delay = next_delay(delay)
        guard = Guard(guard.request, guard.options, guard.view, force_lease=True, poll=True)
        early = await sync_to_async(guard.prepare)()
    return guard, early


# Guarded views whose caller was cancelled (the client left), still running to completion.
_detached: set[asyncio.Future[HttpResponseBase]] = set()


async def _outlive_the_request(task: asyncio.Future[HttpResponseBase]) -> HttpResponseBase:
    """Let a guarded view run on past its cancelled request, then close what it left open.

    Django closed the request's connections on learning that the client left (request_finished);
    the view's later queries ran on a thread asgiref started after that, which nothing else
    closes. This ends the view as Django ends a request, in that thread."""
    try:
        return await task
    finally:
        await sync_to_async(close_old_connections)()


async def _run_guarded(
    call: Callable[[], Awaitable[HttpResponseBase]], guard: Guard
) -> HttpResponseBase:
    try:
        response = await call()
    except BaseException as exc:
        await sync_to_async(guard.abort)()
        if isinstance(exc, LeaseLost):
            return _taken_over(exc)
        if isinstance(exc, UnreadableStep):
            return _unreadable_step(exc)
        if isinstance(exc, StepAmbiguous):
            return _ambiguous(exc)
        if not isinstance(exc, Exception) or not _store_lost(guard):
            raise
        return problems.store_unavailable()
    return await sync_to_async(guard.finish)(response)
