"""A requests transport adapter that keys, retries and journals unsafe requests."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from django_idempotency.contrib import missing

try:
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.exceptions import ConnectTimeoutError
except ModuleNotFoundError as exc:
    raise missing(exc, "requests") from exc

from django_idempotency.outbound.calls import Exchange, run
from django_idempotency.outbound.keys import KEY_HEADER, STEP_HEADER
from django_idempotency.outbound.outcomes import was_replayed
from django_idempotency.outbound.policy import Failure, Result, RetryPolicy


class RequestsWire:
    """What the retry loop needs to know of requests' responses and errors."""

    def result(self, response: requests.Response) -> Result:
        return Result(status=response.status_code, headers=response.headers)

    def failure(self, exc: Exception) -> Failure | None:
        if isinstance(exc, requests.ConnectTimeout):
            return Failure.UNSENT
        if isinstance(exc, requests.ConnectionError):
            # requests wraps urllib3's error: a connection never made, or one lost mid-request.
            reason = getattr(exc.args[0], "reason", None) if exc.args else None
            unsent = isinstance(reason, ConnectTimeoutError)  # NewConnectionError among them.
            return Failure.UNSENT if unsent else Failure.LOST
        if isinstance(exc, requests.Timeout):
            return Failure.LOST  # A read timeout: the request was sent.
        return None

    def replayed(self, response: requests.Response) -> bool:
        return was_replayed(response)


_WIRE = RequestsWire()
logger = logging.getLogger("django_idempotency")


class IdempotentAdapter(HTTPAdapter):
    """Mount it on a `requests.Session`: each unsafe request carries a key derived from the
    operation and step it is made in, and is retried by `policy`.

    `idempotent_session()` mounts one for `http://` and `https://` (mount it for every prefix a
    session calls); name a step per request with the header ``Idempotency-Step: charge``, which
    the adapter takes off before sending.
    """

    __attrs__ = [*HTTPAdapter.__attrs__, "policy", "namespace", "header", "journal"]

    def __init__(
        self,
        *,
        policy: RetryPolicy | None = None,
        namespace: str = "default",
        header: str = KEY_HEADER,
        journal: bool = True,
        **kwargs: Any,
    ) -> None:
        self.policy = policy or RetryPolicy()
        self.namespace = namespace
        self.header = header
        self.journal = journal
        super().__init__(**kwargs)

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: bool | str = True,
        cert: Any = None,
        proxies: dict[str, str] | None = None,
    ) -> requests.Response:
        step = _text(request.headers.pop(STEP_HEADER, None))
        policy = self.policy
        if request.body is not None and not isinstance(request.body, bytes | str):
            # A file or a generator is read once: the request cannot be sent twice.
            policy = dataclasses.replace(policy, max_attempts=1)
        exchange = Exchange.start(
            method=request.method or "GET",
            url=request.url or "",
            key=_text(request.headers.get(self.header)),
            step=step,
            policy=policy,
            namespace=self.namespace,
            journaled=self.journal,
        )
        if exchange.key is not None:
            request.headers[self.header] = exchange.key

        def send_once() -> requests.Response:
            return super(IdempotentAdapter, self).send(
                request, stream=stream, timeout=timeout, verify=verify, cert=cert, proxies=proxies
            )

        return run(exchange, send_once, _WIRE, _discard)


def idempotent_session(
    session: requests.Session | None = None, **adapter_options: Any
) -> requests.Session:
    """`session` (a new one by default) with an `IdempotentAdapter(**adapter_options)` mounted
    for both `http://` and `https://`, and watched: a request that another adapter of it sends
    still carrying `Idempotency-Step` (a more specific prefix mounted later) got no key, no
    retries and no journal, and its header went downstream: that is logged, once a process."""
    session = requests.Session() if session is None else session
    adapter = IdempotentAdapter(**adapter_options)
    for prefix in ("http://", "https://"):
        session.mount(prefix, adapter)
    session.hooks["response"].append(_step_left_unkeyed)
    return session


_warned = False  # The process was told of a step sent by another adapter.


def _step_left_unkeyed(response: requests.Response, *args: Any, **kwargs: Any) -> None:
    """The response hook `idempotent_session` adds: the adapter takes the step's header off
    every request it sends, so a request that still has it was sent by another adapter."""
    global _warned
    if _warned or STEP_HEADER not in response.request.headers:
        return
    _warned = True
    logger.warning(
        "A request naming its step in %s was sent to %s by another adapter of its session than"
        " IdempotentAdapter: it"
        " carried no derived key, was neither retried nor journaled, and the header went"
        " downstream. Mount IdempotentAdapter for that URL's prefix too.",
        STEP_HEADER,
        response.url.split("?", 1)[0],  # Without its query, which may carry a credential.
    )


def _text(value: str | bytes | None) -> str | None:
    return value.decode("latin-1") if isinstance(value, bytes) else value


def _discard(response: requests.Response) -> None:
    response.content  # noqa: B018 - read to its end, so that the connection is reused.
    response.close()
