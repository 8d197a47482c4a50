"""Leases under gunicorn's gevent workers: work that computes without yielding keeps its key."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from django_idempotency.stores.redis import RedisStore
from tests.stores import redis_settings

LEASE = 2.0  # Seconds: the view computes three times as long, never yielding to gevent.
DATABASE_SETTINGS = ("ENGINE", "NAME", "USER", "PASSWORD", "HOST", "PORT", "OPTIONS")

SETTINGS = """
import json
import os

SECRET_KEY = "tests-only"
USE_TZ = os.environ.get("USE_TZ", "1") != "0"
ALLOWED_HOSTS = ["127.0.0.1"]
ROOT_URLCONF = "gevent_site_urls"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_idempotency"]
DATABASES = {"default": json.loads(os.environ["LEASES_DATABASE"])}
globals().update(json.loads(os.environ["LEASES_STORE"]))  # The store's settings.
LOGGING = {
    "version": 1,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_idempotency": {"handlers": ["console"], "level": "INFO"}},
}
"""

URLS = f"""
import os
import time

from django.http import JsonResponse
from django.urls import path

from django_idempotency import idempotent


@idempotent(mode="lease", lease={LEASE})
def compute(request):
    with open(os.environ["LEASES_RUNS"], "a") as runs:  # One line per run, from any worker.
        runs.write("run\\n")
    end = time.monotonic() + 3 * {LEASE}
    while time.monotonic() < end:  # CPU work: no greenlet runs meanwhile in this worker.
        pass
    return JsonResponse({{"computed": True}}, status=201)


urlpatterns = [path("compute/", compute)]
"""


# gunicorn's hook once a worker has loaded the application: a file per worker ready.
READY = """
import os


def post_worker_init(worker):
    open(os.path.join(os.environ["LEASES_READY"], f"worker-ready-{os.getpid()}"), "w").close()
"""


@pytest.fixture
def gevent_workers(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, Path, Path]]:
    """gunicorn -k gevent with two workers, on the store the test is parametrized with (the
    database store on the test database, or the Redis store); its URL, run file and log."""
    (tmp_path / "gevent_site_settings.py").write_text(SETTINGS)
    (tmp_path / "gevent_site_urls.py").write_text(URLS)
    (tmp_path / "gunicorn_ready.py").write_text(READY)
    runs, log = tmp_path / "runs", tmp_path / "gunicorn.log"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    if request.param == "redis":
        # Keys prefixed by this process, as the tests' own, on the test Redis (or Cluster).
        store = redis_settings()
        database = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "db")}
    else:
        request.getfixturevalue("transactional_db")
        store = {}
        # The test database, as this process reaches it.
        database = {name: connection.settings_dict[name] for name in DATABASE_SETTINGS}
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path]),
        "DJANGO_SETTINGS_MODULE": "gevent_site_settings",
        "LEASES_DATABASE": json.dumps(database, default=str),
        "LEASES_STORE": json.dumps(store),
        "LEASES_RUNS": str(runs),
        "LEASES_READY": str(tmp_path),
    }
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "gunicorn", "-k", "gevent", "--workers", "2"),
            *("--config", str(tmp_path / "gunicorn_ready.py")),
            *("--bind", f"127.0.0.1:{port}", "--error-logfile", str(log), "--capture-output"),
            "django.core.wsgi:get_wsgi_application()",
        ],
        # The project's root, as every server the suite starts: the mutation run's stats (mutmut
        # in a process the suite starts) find its configuration there.
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert server.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "gunicorn did not start within 60 s"
                time.sleep(0.1)
        # Both workers serving: the port answers once the arbiter listens, and a worker still
        # starting (Django's set-up, on a loaded machine) would leave the retries to the busy
        # one, which serves them after its work, as replays.
        while len(list(tmp_path.glob("worker-ready-*"))) < 2:
            assert server.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"workers not ready: {log.read_text()}"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}", runs, log
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


def post(url: str, key: str) -> int:
    request = urllib.request.Request(
        f"{url}/compute/",
        data=b"{}",
        headers={"Content-Type": "application/json", "Idempotency-Key": key},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


# The database store on PostgreSQL, the production target (about 30 s, most of it the workers'
# start): the path is the same on every database, each thread with connections of its own. The
# Redis store, whose heartbeat under gevent opens a client of its own (django-redis's pooled
# sockets are the greenlets').
@pytest.mark.parametrize(
    "gevent_workers",
    [
        pytest.param("database", marks=pytest.mark.postgresql),
        pytest.param("redis", marks=pytest.mark.redis),
    ],
    indirect=True,
)
def test_a_gevent_worker_computing_three_times_its_lease_keeps_its_key(
    gevent_workers: tuple[str, Path, Path],
) -> None:
    url, runs, log = gevent_workers
    answers: dict[str, int] = {}
    first = threading.Thread(target=lambda: answers.update(first=post(url, "compute-1")))
    first.start()
    deadline = time.monotonic() + 30
    while not runs.exists():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    retries = []
    began = time.monotonic()
    # Time itself is what is tested: the lease would have run out twice by the end. The busy
    # worker accepts nothing meanwhile: each retry is the other worker's.
    while time.monotonic() - began < 2 * LEASE and first.is_alive():
        retries.append(post(url, "compute-1"))
        time.sleep(LEASE / 4)
    first.join(30)

    assert retries and set(retries) == {409}, (retries, log.read_text())
    assert answers == {"first": 201}
    assert runs.read_text().splitlines() == ["run"]  # The work ran once.
    assert post(url, "compute-1") == 201  # The replay.
    assert runs.read_text().splitlines() == ["run"]


# In a process gevent patched, without a server: the heartbeat's thread is a native one, which
# renews while the only greenlet computes; a store that says its pooled connections belong to the
# greenlets' thread (`greenlet_bound_connections`) is renewed by a greenlet, when the work yields.
PATCHED = """
from gevent import monkey

monkey.patch_all()

import json
import logging
import threading
import time
from datetime import timedelta

import django
from django.conf import settings

settings.configure(USE_TZ=True)
django.setup()

from django_idempotency.core.outcomes import Claim, Outcome
from django_idempotency.leases import heartbeat
from django_idempotency.stores import BaseStore

renewed_in = {"Store": [], "BoundStore": []}


class Store(BaseStore):
    def renew(self, claim, until):
        renewed_in[type(self).__name__].append(threading.get_native_id())
        return True


class BoundStore(Store):
    greenlet_bound_connections = True


class Holder:
    def __init__(self, store):
        self.store, self.claim = store, Claim(Outcome.FRESH)

    def lose(self):
        raise AssertionError("never lost")


def compute(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # Never yields.
        pass


warnings = []
logger = logging.getLogger("django_idempotency")
logger.addHandler(logging.Handler())
logger.handlers[-1].emit = lambda record: warnings.append(record.getMessage())
lease = timedelta(seconds=0.3)
holds = [heartbeat().hold(Holder(store), lease) for store in (Store(), BoundStore())]
# Counted from here: starting the greenlets' heartbeat yields once, and on a loaded machine its
# first renewal may fall due then, before the work starts computing.
before = {name: len(threads) for name, threads in renewed_in.items()}
compute(1.0)
while_computing = {name: len(threads) - before[name] for name, threads in renewed_in.items()}
time.sleep(1.0)  # Yields: the greenlets run.
for hold in holds:
    heartbeat().end(hold)
print(json.dumps({
    "while_computing": while_computing,
    "renewed_in": {name: sorted(set(threads)) for name, threads in renewed_in.items()},
    "main": threading.get_native_id(),
    "warnings": warnings,
}))
"""


def test_under_gevent_the_heartbeat_is_a_native_thread_that_computing_does_not_starve() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PATCHED], capture_output=True, text=True, timeout=60, check=True
    )
    outcome = json.loads(done.stdout)
    main = outcome["main"]

    # Due every 0.1 s: renewed during the second of work, never in the greenlets' thread.
    assert outcome["while_computing"]["Store"] >= 2, outcome
    assert main not in outcome["renewed_in"]["Store"]
    # The bound store's leases wait for the work to yield, and are renewed then, by a greenlet.
    assert outcome["while_computing"]["BoundStore"] == 0, outcome
    assert outcome["renewed_in"]["BoundStore"] == [main]
    [warning] = outcome["warnings"]
    assert warning.startswith("Under gevent, the leases of BoundStore are renewed by a greenlet")
    assert not RedisStore.greenlet_bound_connections  # Its heartbeat has clients of its own.
