"""One outbound call through its attempts: the key, the lease check, the journal, the retry loop.

The httpx transports and the requests adapter drive the same `Exchange`, with `run` (sync) or
`run_async`: they only tell it how to send, read an answer, drop one and classify an error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar
from urllib.parse import urlsplit

from asgiref.sync import sync_to_async

from django_idempotency import signals
from django_idempotency.attempts import Attempt, current_attempt
from django_idempotency.core.keys import key_hash
from django_idempotency.outbound import journal
from django_idempotency.outbound.keys import SAFE_METHODS, KeyChoice, choose_key
from django_idempotency.outbound.outcomes import Outcome, may_have_run, outcome_of
from django_idempotency.outbound.policy import Decision, Failure, Result, RetryPolicy

logger = logging.getLogger("django_idempotency")

Response = TypeVar("Response")
Answer = TypeVar("Answer", contravariant=True)

# Targets already warned about for sending an unsafe request without a key: once each.
_warned_keyless: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()
MAX_WARNED_TARGETS = 1000  # Past this, targets are no longer remembered (nor warned about).


class Wire(Protocol[Answer]):
    """What a client library tells the loop about its requests and responses."""

    def result(self, response: Answer) -> Result: ...

    def failure(self, exc: Exception) -> Failure | None:
        """UNSENT or LOST for the library's transport errors; None for any other exception."""
        ...

    def replayed(self, response: Answer) -> bool: ...


def target_of(url: str) -> tuple[str, str]:
    """scheme://host[:port]/path and host[:port] of a URL: no credentials, no query string."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # An IPv6 address, as written in a URL.
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return f"{parts.scheme}://{host}{parts.path or '/'}", host


@dataclass
class Exchange:
    """The state of one call: its key, its attempts so far, what they may have done."""

    method: str
    target: str
    host: str
    choice: KeyChoice
    policy: RetryPolicy
    journaled: bool
    operation: Attempt | None = None
    attempt: int = 0
    delay: float = 0.0  # Before the next attempt, as the last decision asked.
    started: float = 0.0
    earlier_may_have_run: bool = False
    _sent: float = field(default=0.0, repr=False)

    @classmethod
    def start(
        cls,
        *,
        method: str,
        url: str,
        key: str | None,
        step: str | None,
        policy: RetryPolicy,
        namespace: str,
        journaled: bool,
    ) -> Exchange:
        """Choose the key (raising `OutsideOperation` for a step with nothing to derive from)."""
        method = method.upper()
        target, host = target_of(url)
        choice = choose_key(method, key, step, namespace=namespace)
        if choice.key is None and method not in SAFE_METHODS:
            _warn_keyless(method, target)
        return cls(method, target, host, choice, policy, journaled, current_attempt())

    @property
    def key(self) -> str | None:
        return self.choice.key

    @property
    def retryable(self) -> bool:
        return self.key is not None or self.method in SAFE_METHODS

    def before_send(self) -> None:
        """Stop (`LeaseLost`) if the operation lost its claim; journal the first attempt."""
        if self.operation is not None:
            self.operation.ensure_lease()
        if self.attempt == 0:
            self.started = self.policy.clock()
            if self.key is not None and self.journaled:
                journal.open_call(
                    self.key,
                    method=self.method,
                    target=self.target,
                    host=self.host,
                    step=self.choice.step,
                    scope=self.choice.scope,
                    operation_id=self.choice.operation_id,
                )
        self.attempt += 1
        self._sent = time.perf_counter()

    def answered(self, result: Result, *, replayed: bool = False) -> Decision:
        """An answer came back: retry it, or stop there."""
        return self._after(result, replayed, retryable=self.retryable)

    def failed(self, exc: Exception, failure: Failure | None) -> Decision:
        """The attempt raised; an exception that is not the library's transport error (None)
        is never retried, and the request may have left: LOST."""
        result = Result(failure=failure or Failure.LOST, error=type(exc).__name__)
        return self._after(result, False, retryable=self.retryable and failure is not None)

    def _after(self, result: Result, replayed: bool, *, retryable: bool) -> Decision:
        duration = time.perf_counter() - self._sent
        elapsed = self.policy.clock() - self.started
        decision = self.policy.decide(
            result, attempt=self.attempt, elapsed=elapsed, keyed=retryable
        )
        outcome: Outcome = (
            "sending"
            if decision.retry
            else outcome_of(result, earlier_may_have_run=self.earlier_may_have_run)
        )
        self.earlier_may_have_run = self.earlier_may_have_run or may_have_run(result)
        self.delay = decision.delay
        if self.key is not None and self.journaled:
            journal.note_attempt(
                self.key,
                status=result.status,
                error=result.error,
                outcome=outcome,
                replayed=replayed,
            )
        self._log(result, decision, outcome)
        signals.outbound_attempt.send_robust(
            sender=Exchange,
            key=self.key,
            method=self.method,
            target=self.target,
            host=self.host,
            attempt=self.attempt,
            status=result.status,
            error=result.error or None,
            outcome=outcome,
            replayed=replayed,
            duration=duration,
        )
        return decision

    def _log(self, result: Result, decision: Decision, outcome: str) -> None:
        answer = str(result.status) if result.status is not None else result.error
        hashed = key_hash(self.key) if self.key is not None else "-"
        if decision.retry:
            logger.info(
                "outbound %s %s attempt %d got %s; retrying in %.2f s (key_hash=%s)",
                self.method,
                self.target,
                self.attempt,
                answer,
                decision.delay,
                hashed,
            )
        elif outcome in ("failed", "ambiguous"):
            logger.warning(
                "outbound %s %s %s after %d attempt(s), the last got %s: %s (key_hash=%s)",
                self.method,
                self.target,
                outcome,
                self.attempt,
                answer,
                decision.reason,
                hashed,
            )


def run(
    exchange: Exchange,
    send: Callable[[], Response],
    wire: Wire[Response],
    discard: Callable[[Response], None],
) -> Response:
    """Send until the policy stops: return the last answer, or raise the last error."""
    while True:
        exchange.before_send()
        try:
            response = send()
        except Exception as exc:
            if not exchange.failed(exc, wire.failure(exc)).retry:
                raise
        else:
            if not exchange.answered(wire.result(response), replayed=wire.replayed(response)).retry:
                return response
            discard(response)
        exchange.policy.sleep(exchange.delay)


async def run_async(
    exchange: Exchange,
    send: Callable[[], Awaitable[Response]],
    wire: Wire[Response],
    discard: Callable[[Response], Awaitable[None]],
) -> Response:
    """`run` for an async client: the journal is written through `sync_to_async`."""
    while True:
        await sync_to_async(exchange.before_send)()
        try:
            response = await send()
        except Exception as exc:
            failed = await sync_to_async(exchange.failed)(exc, wire.failure(exc))
            if not failed.retry:
                raise
        else:
            result, replayed = wire.result(response), wire.replayed(response)
            if not (await sync_to_async(exchange.answered)(result, replayed=replayed)).retry:
                return response
            await discard(response)
        await exchange.policy.async_sleep(exchange.delay)


def _warn_keyless(method: str, target: str) -> None:
    with _warned_lock:
        if (method, target) in _warned_keyless or len(_warned_keyless) >= MAX_WARNED_TARGETS:
            return
        _warned_keyless.add((method, target))
    logger.warning(
        "outbound %s %s is sent without an Idempotency-Key, so it is sent once and never "
        "retried: make it from a step (django_idempotency.steps), name one per request, or "
        "set the header (django_idempotency.outbound.key_for).",
        method,
        target,
    )
