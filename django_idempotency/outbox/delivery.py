"""Sending one message: a task to the Celery broker, a request through the outbound client."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from django_idempotency.models import OutboxMessage
from django_idempotency.outbound.keys import KEY_HEADER
from django_idempotency.outbound.outcomes import NOT_DONE_STATUSES, is_decision
from django_idempotency.outbound.policy import RetryPolicy

# Answers that say the request was not handled, this time: a timeout waiting for it (408), the
# wrong server (421), a locked resource (423), too early (425), too many requests (429), a
# service unavailable for now (503). The same message is sent again later.
NOT_YET = frozenset({408, 421, 423, 425, 429, 503})
# Redirects that say the request was not handled here (303, "see other", says it was).
MOVED = frozenset({300, 301, 302, 305, 307, 308})


class Verdict(enum.Enum):
    SENT = "sent"  # The broker took it, or the receiver answered with its decision.
    RETRY = "retry"  # Not delivered this time: tried again after the policy's backoff.
    DEAD = "dead"  # Refused as wrong: the same message would be refused again.


@dataclass(frozen=True)
class Delivery:
    verdict: Verdict
    error: str = ""


def send_task(message: OutboxMessage, app: Any) -> Delivery:
    """Publish the task call with the message's key as its id; a redelivered call with that id
    is the same call to an `idempotent_task`, which runs its body once."""
    payload = message.payload or {}
    try:
        if app is None:
            from celery import current_app  # type: ignore[import-untyped]

            app = current_app
        app.send_task(
            message.destination,
            args=payload.get("args", []),
            kwargs=payload.get("kwargs", {}),
            task_id=message.key,
            **payload.get("options", {}),
        )
    except Exception as exc:  # The broker is down or refused it (or Celery is not installed).
        return Delivery(Verdict.RETRY, _describe(exc))
    return Delivery(Verdict.SENT)


class RequestSender:
    """Sends request messages through one httpx client with the outbound client's transport
    (its retries within a delivery, its journal), opened on first use."""

    def __init__(self, client: Any = None, policy: RetryPolicy | None = None) -> None:
        self._client = client
        self._policy = policy
        self._owned = client is None

    def __call__(self, message: OutboxMessage) -> Delivery:
        try:
            client = self._open()
        except ModuleNotFoundError as exc:  # httpx is not installed: retried, then dead.
            return Delivery(Verdict.RETRY, _describe(exc))
        headers = [(name, value) for name, value in (message.payload or {}).get("headers", [])]
        headers = [(n, v) for n, v in headers if n.lower() != KEY_HEADER.lower()]
        headers.append((KEY_HEADER, message.key))
        try:
            response = client.request(
                message.method, message.destination, headers=headers, content=message.body
            )
        except Exception as exc:  # No answer, after the transport's own retries.
            return Delivery(Verdict.RETRY, _describe(exc))
        response.close()
        status = response.status_code
        if status in MOVED:
            # Not followed: a request re-sent elsewhere is the destination's to decide on.
            where = response.headers.get("Location", "")[:100]
            return Delivery(Verdict.DEAD, f"answered {status}: moved to {where}")
        if status in NOT_YET:
            return Delivery(Verdict.RETRY, f"answered {status}")
        if is_decision(status):
            return Delivery(Verdict.SENT)
        if status in NOT_DONE_STATUSES:
            return Delivery(Verdict.DEAD, f"answered {status}")
        return Delivery(Verdict.RETRY, f"answered {status}")

    def _open(self) -> Any:
        if self._client is None:
            import httpx  # The extra; missing, the caller retries the message until it is there.

            from django_idempotency.outbound.transport import IdempotentTransport

            self._client = httpx.Client(transport=IdempotentTransport(policy=self._policy))
        return self._client

    def close(self) -> None:
        if self._owned and self._client is not None:
            self._client.close()
            self._client = None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:255]
