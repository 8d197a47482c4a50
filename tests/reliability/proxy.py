"""A loopback HTTP proxy that loses answers: it forwards each request to the upstream server and,
with a seeded probability, closes the client's connection instead of sending the answer back.

The upstream did the work; the caller never learns it. One request per connection (the proxy
adds `Connection: close` both ways), held for a random moment before it is forwarded and again
before its answer is, so that a caller's crash may land while the upstream runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
import threading
import time
from dataclasses import dataclass, field
from types import TracebackType

HEADERS_END = b"\r\n\r\n"
LIMIT = 1 << 20  # Bytes of one request or answer: the scenario's are a few hundred.


@dataclass(frozen=True)
class Exchange:
    """One request the proxy forwarded, and what became of its answer."""

    key: str  # Its Idempotency-Key ("" without one).
    attempt: int  # How many requests with this key came before it (0: the first).
    status: int  # The upstream's status (0: the upstream gave no answer).
    dropped: bool  # The answer was not passed on.
    # time.time() when the request arrived: a caller may get the answer, act on it and die
    # before this thread, having passed the answer on, is scheduled again.
    at: float


@dataclass
class DroppingProxy:
    """Forwards to 127.0.0.1:`upstream`; drops each answer with probability `drop`, drawn from
    `seed`, the request's key and how many requests with that key came before (so a seed
    names the same drops again); holds requests and answers up to `hold` seconds each."""

    upstream: int
    drop: float
    seed: int
    hold: float = 0.0
    exchanges: list[Exchange] = field(default_factory=list)
    _listener: socket.socket | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _seen: dict[str, int] = field(default_factory=dict)
    _stopped: threading.Event = field(default_factory=threading.Event)

    @property
    def port(self) -> int:
        assert self._listener is not None, "start the proxy first"
        return int(self._listener.getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def dropped(self) -> list[Exchange]:
        with self._lock:
            return [exchange for exchange in self.exchanges if exchange.dropped]

    def __enter__(self) -> DroppingProxy:
        listener = socket.create_server(("127.0.0.1", 0), backlog=256)
        listener.settimeout(0.2)  # The accept loop looks at _stopped this often.
        self._listener = listener
        threading.Thread(target=self._accept, name="dropping-proxy", daemon=True).start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stopped.set()
        if self._listener is not None:
            self._listener.close()

    def draw(self, what: str, key: str, attempt: int) -> float:
        """A number in [0, 1) fixed by the seed, what it decides, the key and the attempt."""
        text = f"{self.seed}\x00{what}\x00{key}\x00{attempt}".encode()
        return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") / 2**64

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:  # Closed by __exit__.
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with contextlib.closing(client):
            client.settimeout(30)
            request = _read_message(client, whole=False)
            if request is None:
                return
            arrived = time.time()
            key = _header(request, b"idempotency-key")
            with self._lock:
                attempt = self._seen.get(key, 0)
                self._seen[key] = attempt + 1
            time.sleep(self.hold * self.draw("hold-request", key, attempt))
            answer = self._forward(_closing(request))
            time.sleep(self.hold * self.draw("hold-answer", key, attempt))
            dropped = answer is None or self.draw("drop", key, attempt) < self.drop
            if not dropped and answer is not None:
                with contextlib.suppress(OSError):  # The caller died meanwhile.
                    client.sendall(_closing(answer))
            with self._lock:
                self.exchanges.append(Exchange(key, attempt, _status(answer), dropped, arrived))

    def _forward(self, request: bytes) -> bytes | None:
        try:
            with socket.create_connection(("127.0.0.1", self.upstream), timeout=30) as upstream:
                upstream.sendall(request)
                return _read_message(upstream, whole=True)
        except OSError:
            return None


def _read_message(connection: socket.socket, *, whole: bool) -> bytes | None:
    """A request (headers and Content-Length bytes of body) or, `whole`, all until the server
    closes; None if the peer closed or failed first."""
    data = b""
    try:
        while HEADERS_END not in data or whole:
            chunk = connection.recv(65536)
            if not chunk:
                return data if whole and data else None
            data += chunk
            if len(data) > LIMIT:
                return None
        head, _, body = data.partition(HEADERS_END)
        length = int(_header(head, b"content-length") or 0)
        while len(body) < length:
            chunk = connection.recv(65536)
            if not chunk:
                return None
            body += chunk
    except (OSError, ValueError):
        return None
    return head + HEADERS_END + body


def _header(message: bytes, name: bytes) -> str:
    head = message.split(HEADERS_END, 1)[0]
    for line in head.split(b"\r\n")[1:]:
        field_name, _, value = line.partition(b":")
        if field_name.strip().lower() == name:
            return value.strip().decode("latin-1")
    return ""


def _closing(message: bytes) -> bytes:
    """The message with `Connection: close` in place of any Connection header."""
    head, _, body = message.partition(HEADERS_END)
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
    return b"\r\n".join([*lines, b"Connection: close"]) + HEADERS_END + body


def _status(answer: bytes | None) -> int:
    if not answer:
        return 0
    try:
        return int(answer.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0
