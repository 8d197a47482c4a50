"""httpx transports, sync and async, that key, retry and journal unsafe requests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from django_idempotency.contrib import missing

try:
    import httpx
except ModuleNotFoundError as exc:
    raise missing(exc, "httpx") from exc

from django_idempotency.outbound.calls import Exchange, run, run_async
from django_idempotency.outbound.keys import KEY_HEADER, STEP_EXTENSION, STEP_HEADER
from django_idempotency.outbound.outcomes import was_replayed
from django_idempotency.outbound.policy import Failure, Result, RetryPolicy

# Errors raised before the request could leave: no connection was made.
_UNSENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)
# Errors after it may have left: the answer is lost, not the request.
_LOST = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


class HttpxWire:
    """What the retry loop needs to know of httpx's responses and errors."""

    def result(self, response: httpx.Response) -> Result:
        return Result(status=response.status_code, headers=response.headers)

    def failure(self, exc: Exception) -> Failure | None:
        if isinstance(exc, _UNSENT):
            return Failure.UNSENT
        if isinstance(exc, _LOST):
            return Failure.LOST
        return None

    def replayed(self, response: httpx.Response) -> bool:
        return was_replayed(response)


_WIRE = HttpxWire()
Inner = TypeVar("Inner", httpx.BaseTransport, httpx.AsyncBaseTransport)


class _Keyed(Generic[Inner]):
    """What both transports share: the inner transport, the policy, the key's namespace and
    header, the journal switch."""

    inner: Callable[[], Inner]  # Builds the inner transport when none is given.

    def __init__(
        self,
        transport: Inner | None = None,
        *,
        policy: RetryPolicy | None = None,
        namespace: str = "default",
        header: str = KEY_HEADER,
        journal: bool = True,
    ) -> None:
        self.transport: Inner = transport if transport is not None else self.inner()
        self.policy = policy or RetryPolicy()
        self.namespace = namespace
        self.header = header
        self.journal = journal

    def exchange(self, request: httpx.Request) -> Exchange:
        """Start the call, with the key set on the request (the caller's, or derived)."""
        step = request.extensions.get(STEP_EXTENSION) or request.headers.get(STEP_HEADER)
        request.headers.pop(STEP_HEADER, None)
        exchange = Exchange.start(
            method=request.method,
            url=str(request.url),
            key=request.headers.get(self.header),
            step=step,
            policy=self.policy,
            namespace=self.namespace,
            journaled=self.journal,
        )
        if exchange.key is not None:
            request.headers[self.header] = exchange.key
        return exchange


class IdempotentTransport(_Keyed[httpx.BaseTransport], httpx.BaseTransport):
    """Wraps a transport (by default `httpx.HTTPTransport()`): each unsafe request carries a
    key derived from the operation and step it is made in, and is retried by `policy`.

    ``httpx.Client(transport=IdempotentTransport())``; name a step per request with
    ``extensions={"idempotency_step": "charge"}``.
    """

    inner = httpx.HTTPTransport

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        exchange = self.exchange(request)
        request.read()  # Kept in memory, so that every attempt sends the same body.
        return run(exchange, lambda: self.transport.handle_request(request), _WIRE, _discard)

    def close(self) -> None:
        self.transport.close()


class AsyncIdempotentTransport(_Keyed[httpx.AsyncBaseTransport], httpx.AsyncBaseTransport):
    """`IdempotentTransport` for ``httpx.AsyncClient`` (by default around
    `httpx.AsyncHTTPTransport()`)."""

    inner = httpx.AsyncHTTPTransport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        exchange = self.exchange(request)
        await request.aread()
        return await run_async(
            exchange, lambda: self.transport.handle_async_request(request), _WIRE, _adiscard
        )

    async def aclose(self) -> None:
        await self.transport.aclose()


def _discard(response: httpx.Response) -> None:
    response.read()  # Read to its end, so that the connection goes back to the pool.
    response.close()


async def _adiscard(response: httpx.Response) -> None:
    await response.aread()
    await response.aclose()
