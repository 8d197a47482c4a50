"""Native threads and locks, also where gevent made `threading` run greenlets."""

from __future__ import annotations

import _thread
import contextlib
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

# Seconds between two tries of a lock a greenlet waits for: its thread's other greenlets run
# in between.
POLL = 0.001


def green() -> str | None:
    """The library that monkey-patched `threading` in this process ("gevent", "eventlet"), or
    None: its threads are then greenlets, which run only when the running one yields, so work
    that computes without yielding starves them."""
    gevent = sys.modules.get("gevent.monkey")
    if gevent is not None and gevent.is_module_patched("threading"):
        return "gevent"
    eventlet = sys.modules.get("eventlet.patcher")
    if eventlet is not None and eventlet.is_monkey_patched("thread"):
        return "eventlet"
    return None


def _original(name: str, *, native: bool = True) -> Any:
    """`_thread.<name>` as the interpreter made it, before gevent patched it (with `native`),
    or as the process has it. Eventlet's is left as eventlet made it: a green one (the
    heartbeat warns about it)."""
    if native and green() == "gevent":
        return sys.modules["gevent.monkey"].get_original("_thread", name)
    return getattr(_thread, name)


class Lock:
    """A native lock, shared by native threads and greenlets.

    A native thread waits for it as for any lock. A greenlet (under gevent or eventlet) that
    finds it held polls it, yielding in between, instead of blocking its whole thread, and with
    it every other greenlet, until a native thread releases it.
    """

    def __init__(self) -> None:
        self._lock = _original("allocate_lock")()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(False):
            return True
        if not blocking:
            return False
        if green() is None or _original("get_ident")() in _natives:
            return bool(self._lock.acquire(True, timeout))
        deadline = None if timeout < 0 else time.monotonic() + timeout
        while not self._lock.acquire(False):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(POLL)  # Patched: the thread's other greenlets run meanwhile.
        return True

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class Wakeup:
    """A wake-up call for one thread that sleeps until it is due: `set` from any thread or
    greenlet wakes its `wait` (now, or at once if it is not waiting yet). Not `native`: for a
    thread that may be a greenlet, whose wait must let the others run."""

    def __init__(self, *, native: bool = True) -> None:
        self._lock = _original("allocate_lock", native=native)()
        self._lock.acquire()  # Held: not set.

    def set(self) -> None:
        with contextlib.suppress(RuntimeError):  # Already set, and not yet waited for.
            self._lock.release()

    def wait(self, timeout: float | None) -> None:
        """Until set (and then no longer set), or `timeout` seconds (None: no limit)."""
        self._lock.acquire(True, -1 if timeout is None else timeout)


# The native threads `start_thread` started under gevent: there, a `Lock` blocks as in any.
_natives: set[int] = set()


def native_under_gevent() -> bool:
    """Whether the calling thread is a native one `start_thread` started under gevent (the
    heartbeat's): the sockets the greenlets' thread opened belong to its hub, not to this one."""
    return green() == "gevent" and _original("get_ident")() in _natives


def native_local() -> Any:
    """A `threading.local` of native threads: under gevent, `threading.local` is each
    greenlet's, and a native thread's own data must die with the thread, not its greenlet."""
    return _original("_local")()


def start_thread(target: Callable[[], None], name: str, *, native: bool = True) -> None:
    """Run `target` in a new daemon thread (it never holds the process up at its exit) called
    `name`: a native OS thread, under gevent too, where `threading.Thread` would make a
    greenlet of it, which runs only when the greenlet running yields; not `native`, a thread as
    the process makes them (a greenlet there)."""
    if not native or green() != "gevent":
        threading.Thread(target=target, name=name, daemon=True).start()
        return

    def run_natively() -> None:
        ident = _original("get_ident")()
        _natives.add(ident)
        try:
            target()
        finally:
            _natives.discard(ident)

    _original("start_new_thread")(run_natively, ())
