"""Test-only crash points of the payout flow: a worker SIGKILLs itself where a run asks it to.

Off unless DEMO_CRASH_POINTS is set, e.g. "before-call:0.1,after-bank:0.2": each named point of
a payout crashes with that probability, drawn from DEMO_CRASH_SEED and the payout's key (so a
seed names the same crashes again), and at most once per point and key (a marker file in
DEMO_CRASH_DIR), so that the retry gets past it. Each crash is logged to crashes.jsonl there
before the worker dies. The reliability suite's end-to-end scenario sets them; never a project.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

POINTS = ("before-call", "during-call", "after-bank", "after-step")
LOG = "crashes.jsonl"


def probabilities() -> dict[str, float]:
    """DEMO_CRASH_POINTS as {point: probability}; empty when crashes are off."""
    chosen: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in settings.DEMO_CRASH_POINTS.split(","))):
        point, _, probability = item.partition(":")
        if point not in POINTS:
            raise ImproperlyConfigured(
                f"DEMO_CRASH_POINTS names {point!r}: use {', '.join(POINTS)}, each with a "
                "probability, e.g. 'after-bank:0.2'."
            )
        try:
            chosen[point] = float(probability)
        except ValueError:
            raise ImproperlyConfigured(
                f"DEMO_CRASH_POINTS: {item!r} needs a probability from 0 to 1, e.g. '{point}:0.2'."
            ) from None
    if chosen and not settings.DEMO_CRASH_DIR:
        raise ImproperlyConfigured(
            "DEMO_CRASH_POINTS is set without DEMO_CRASH_DIR: name a folder where each crash "
            "is marked, so that a retry gets past it."
        )
    return chosen


def draw(seed: str, point: str, key: str) -> float:
    """A number in [0, 1) fixed by the seed, the point and the key: below the point's
    probability, the payout of that key crashes there (a run can tell which will)."""
    text = f"{seed}\x00{point}\x00{key}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") / 2**64


def _chosen(point: str, key: str) -> bool:
    probability = probabilities().get(point, 0.0)
    if probability <= 0 or draw(settings.DEMO_CRASH_SEED, point, key) >= probability:
        return False
    digest = hashlib.sha256(f"{point}\x00{key}".encode()).hexdigest()
    try:  # Once per point and key: the retry must get past it.
        os.close(os.open(Path(settings.DEMO_CRASH_DIR) / digest, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


def _die(point: str, key: str) -> None:
    line = json.dumps({"point": point, "key": key, "at": time.time(), "pid": os.getpid()})
    descriptor = os.open(
        Path(settings.DEMO_CRASH_DIR) / LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
    )
    try:
        os.write(descriptor, (line + "\n").encode())
    finally:
        os.close(descriptor)
    os.kill(os.getpid(), signal.SIGKILL)


def crash_point(point: str, key: str) -> None:
    """Die here if the run asks for a crash at this point of this key's payout."""
    if _chosen(point, key):
        _die(point, key)


@contextlib.contextmanager
def crash_during(point: str, key: str, within: float) -> Iterator[None]:
    """Die at a moment within `within` seconds of entering the block, unless it ends first."""
    if not _chosen(point, key):
        yield
        return
    delay = draw(settings.DEMO_CRASH_SEED, f"{point}:delay", key) * within
    timer = threading.Timer(delay, _die, (point, key))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
