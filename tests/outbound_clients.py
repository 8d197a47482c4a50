"""The outbound client's three drivers behind one small interface, and a clock that never waits.

Tests run each retry rule through the httpx transport, the async httpx transport and the
requests adapter alike, against the live server (tests/downstream.py).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import requests
from asgiref.sync import async_to_sync

from django_idempotency.outbound import (
    AsyncIdempotentTransport,
    IdempotentAdapter,
    IdempotentTransport,
    RetryPolicy,
    was_replayed,
)


@dataclass
class Clock:
    """The policy's sleep, clock and random source: each delay asked is noted and the clock
    moved on by it, without waiting; `random` returns the top of the range it is asked for,
    noting the range, unless a test gives its own."""

    now: float = 1000.0
    slept: list[float] = field(default_factory=list)
    ranges: list[tuple[float, float]] = field(default_factory=list)

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)

    def clock(self) -> float:
        return self.now

    def top(self, low: float, high: float) -> float:
        self.ranges.append((low, high))
        return high

    def policy(self, **options: Any) -> RetryPolicy:
        options.setdefault("random", self.top)
        return RetryPolicy(
            sleep=self.sleep, async_sleep=self.async_sleep, clock=self.clock, **options
        )


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]
    replayed: bool


class Caller:
    """Sends one request through a driver; `timeout_error` and `connect_error` are the
    exceptions its library raises."""

    timeout_error: type[Exception]
    connect_error: type[Exception]

    def __init__(self, policy: RetryPolicy, **options: Any) -> None:
        self.policy = policy
        self.options = options

    def send(
        self,
        method: str,
        url: str,
        *,
        key: str | None = None,
        step: str | None = None,
        timeout: float = 10.0,
        json: Any = None,
    ) -> Answer:
        raise NotImplementedError


class HttpxCaller(Caller):
    timeout_error = httpx.ReadTimeout
    connect_error = httpx.ConnectError

    def send(self, method: str, url: str, **kwargs: Any) -> Answer:
        transport = IdempotentTransport(policy=self.policy, **self.options)
        with httpx.Client(transport=transport) as client:
            return answer_of(client.request(method, url, **_httpx_arguments(**kwargs)))


class AsyncHttpxCaller(Caller):
    timeout_error = httpx.ReadTimeout
    connect_error = httpx.ConnectError

    def send(self, method: str, url: str, **kwargs: Any) -> Answer:
        return async_to_sync(self._send)(method, url, **kwargs)

    async def _send(self, method: str, url: str, **kwargs: Any) -> Answer:
        transport = AsyncIdempotentTransport(policy=self.policy, **self.options)
        async with httpx.AsyncClient(transport=transport) as client:
            return answer_of(await client.request(method, url, **_httpx_arguments(**kwargs)))


class RequestsCaller(Caller):
    timeout_error = requests.ReadTimeout
    connect_error = requests.ConnectionError

    def send(
        self,
        method: str,
        url: str,
        *,
        key: str | None = None,
        step: str | None = None,
        timeout: float = 10.0,
        json: Any = None,
    ) -> Answer:
        headers = {}
        if key is not None:
            headers["Idempotency-Key"] = key
        if step is not None:
            headers["Idempotency-Step"] = step
        with requests.Session() as session:
            session.mount("http://", IdempotentAdapter(policy=self.policy, **self.options))
            return answer_of(
                session.request(method, url, headers=headers, timeout=timeout, json=json)
            )


def answer_of(response: httpx.Response | requests.Response) -> Answer:
    return Answer(response.status_code, response.headers, was_replayed(response))


def _httpx_arguments(
    *, key: str | None = None, step: str | None = None, timeout: float = 10.0, json: Any = None
) -> dict[str, Any]:
    return {
        "headers": {"Idempotency-Key": key} if key is not None else {},
        "extensions": {"idempotency_step": step} if step is not None else {},
        "timeout": timeout,
        "json": json,
    }


CALLERS: dict[str, type[Caller]] = {
    "httpx": HttpxCaller,
    "httpx_async": AsyncHttpxCaller,
    "requests": RequestsCaller,
}


@contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port bound but not listening: every connection to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]
