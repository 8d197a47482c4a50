"""HTTP clients for the reliability suite: single requests, and duplicates raced from processes."""

from __future__ import annotations

import base64
import http.client
import json
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

PROBLEM = "application/problem+json"
TIMEOUT = 60  # Seconds for one request, and for one barrier wait.


@dataclass(frozen=True)
class Answer:
    status: int  # 0: no HTTP response (connection refused, reset, timed out)
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    error: str = ""

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)

    def all(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]

    @property
    def replayed(self) -> bool:
        return self.header("Idempotent-Replayed") == "true"

    @property
    def is_problem(self) -> bool:
        return (self.header("Content-Type") or "").startswith(PROBLEM)

    def problem(self) -> dict[str, Any]:
        """The problem+json body, checked for the members every problem carries."""
        assert self.is_problem, self
        document = json.loads(self.body)
        assert isinstance(document, dict), self
        assert {"type", "title", "status", "detail"} <= document.keys(), self
        assert document["status"] == self.status, self
        return document

    def json(self) -> Any:
        return json.loads(self.body)

    def __str__(self) -> str:
        return f"{self.status} {self.error} {dict(self.headers)} {self.body[:2000]!r}"


def basic(username: str, password: str) -> tuple[str, str]:
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    return ("Authorization", f"Basic {token}")


def send(
    base_url: str,
    method: str,
    path: str,
    body: bytes | Mapping[str, Any] | None = None,
    headers: Iterable[tuple[str, str | bytes]] = (),
    *,
    timeout: float = TIMEOUT,
) -> Answer:
    """One request on a new connection; header values may be bytes (sent as they are)."""
    if isinstance(body, Mapping):
        body = json.dumps(body).encode()
        headers = [("Content-Type", "application/json"), *headers]
    parts = urlsplit(base_url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        connection.putrequest(method, path, skip_accept_encoding=True)
        for name, value in headers:
            connection.putheader(name, value)
        if body is not None:
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return Answer(response.status, tuple(response.getheaders()), response.read())
    except (OSError, http.client.HTTPException) as exc:
        return Answer(0, error=f"{type(exc).__name__}: {exc}")
    finally:
        connection.close()


def post(
    base_url: str,
    path: str,
    body: bytes | Mapping[str, Any] | None,
    key: str | None = None,
    headers: Iterable[tuple[str, str | bytes]] = (),
    *,
    timeout: float = TIMEOUT,
) -> Answer:
    extra = [("Idempotency-Key", key)] if key is not None else []
    return send(base_url, "POST", path, body, [*extra, *headers], timeout=timeout)


# Seconds from one request of a load's client to its next: eight such clients send at most 80
# requests a second. Unpaced, a client sends its next request as soon as it has an answer: the
# load then takes every core the machine has (6,000 requests in 20 s on two cores) and is heavier
# on a fast machine than on a slow one, while the outages and fail-overs it runs through need
# only requests in each of their phases, a few hundred each.
REQUEST_INTERVAL = 0.1


def paced(interval: float = REQUEST_INTERVAL) -> Callable[[], None]:
    """A wait for one client's loop, called before each request: it returns `interval` seconds
    after it last did (at once if the request took longer)."""
    due = time.monotonic()

    def wait() -> None:
        nonlocal due
        now = time.monotonic()
        if now < due:
            time.sleep(due - now)
            now = due
        due = now + interval

    return wait


@dataclass(frozen=True)
class Race:
    """Every key sent `duplicates` times at once, from `processes` client processes.

    Each process runs `duplicates // processes` threads; all the threads of all the processes
    wait at one barrier before each key, so a key's duplicates leave together. `lanes` such
    groups run side by side on different keys.
    """

    base_url: str
    path: str
    body: Mapping[str, Any]  # Each key's body: this, with the key as the description.
    duplicates: int = 16
    processes: int = 4
    lanes: int = 2
    extra_headers: tuple[tuple[str, str], ...] = field(default=())

    def run(self, keys: list[str]) -> dict[str, list[Answer]]:
        context = multiprocessing.get_context("spawn")
        threads = self.duplicates // self.processes
        assert threads * self.processes == self.duplicates
        barriers = [context.Barrier(self.duplicates) for _ in range(self.lanes)]
        lanes = [keys[lane :: self.lanes] for lane in range(self.lanes)]
        results = context.Queue()
        workers = [
            context.Process(
                target=_client_process,
                args=(self, lanes, threads, barriers, results),
                daemon=True,
            )
            for _ in range(self.processes)
        ]
        for worker in workers:
            worker.start()
        answers: dict[str, list[Answer]] = {key: [] for key in keys}
        try:
            for _ in workers:
                for key, answer in results.get(timeout=600):
                    answers[key].append(answer)
        finally:
            for worker in workers:
                worker.join(timeout=30)
                if worker.is_alive():
                    worker.terminate()
        return answers


def _client_process(
    race: Race,
    lanes: list[list[str]],
    threads: int,
    barriers: list[Any],
    results: Any,
) -> None:
    collected: list[tuple[str, Answer]] = []
    lock = threading.Lock()

    def lane_thread(keys: list[str], barrier: Any) -> None:
        for key in keys:
            try:
                barrier.wait(timeout=TIMEOUT)
            except threading.BrokenBarrierError:
                answer = Answer(0, error="the barrier broke: another client failed")
            else:
                body = {**race.body, "description": key}
                answer = post(race.base_url, race.path, body, key, race.extra_headers)
            with lock:
                collected.append((key, answer))

    pool = [
        threading.Thread(target=lane_thread, args=(keys, barriers[lane]))
        for lane, keys in enumerate(lanes)
        for _ in range(threads)
    ]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    results.put(collected)
