"""The reliability run's own PostgreSQL and Redis, the demo under gunicorn, and its figures."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]
SERVICES_SH = ROOT / "scripts" / "services.sh"
DATABASE = "reliability"
# Nothing started here outlives this, even if the test process is killed.
LIFETIME = 1200
PASSWORD = "reliability-only-password"
# username: (is_staff, tenants)
USERS = {
    "alice": (True, ["acme"]),
    "bob": (False, ["globex"]),
    "carol": (False, ["acme"]),
}


class ServiceError(RuntimeError):
    """A server the suite needs could not be started: the run fails, it is never skipped."""


def wait_until(condition_met: Callable[[], bool], seconds: float, what: str) -> None:
    """Poll every 50 ms; fail the test after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition_met():
        if time.monotonic() > deadline:
            raise AssertionError(f"Waited {seconds} s for {what}.")
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Services:
    """PostgreSQL and Redis of this run alone, started with scripts/services.sh.

    The suite stops and starts them mid-run, so they must not be the servers that the other
    test environments share.
    """

    directory: Path
    pg_port: int = field(default_factory=free_port)
    redis_port: int = field(default_factory=free_port)
    _reaper: subprocess.Popen[bytes] | None = None

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.pg_port}/postgres"

    @property
    def database_url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.pg_port}/{DATABASE}"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}"

    def _services(self, script: str) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "SERVICES_DIR": str(self.directory),
            "PG_PORT": str(self.pg_port),
            "REDIS_PORT": str(self.redis_port),
        }
        return subprocess.run(
            ["bash", "-c", f"source '{SERVICES_SH}'; {script}"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def _start(self, function: str) -> None:
        result = self._services(function)
        if result.returncode != 0:
            raise ServiceError(
                f"scripts/services.sh {function} failed ({result.returncode}): "
                f"{result.stderr.strip() or result.stdout.strip()}"
            )

    def start_postgres(self) -> None:
        self._start("start_postgres")

    def stop_postgres(self) -> None:
        # The cluster is this run's own: stop it whoever started it.
        self._services("PG_STARTED_HERE=1 stop_postgres")

    def restart_postgres(self) -> None:
        """Stop the cluster (fast: every client connection is cut), start it again, and return
        once it accepts connections."""
        self.stop_postgres()
        self.start_postgres()
        # pg_ctl -w waits for the server to be ready; a client connecting proves it from outside.
        wait_until(self._postgres_accepts, 30, "PostgreSQL to accept connections again")

    def _postgres_accepts(self) -> bool:
        try:
            with psycopg.connect(self.admin_url, connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def start_redis(self) -> None:
        self._start("start_redis")

    def stop_redis(self) -> None:
        self._services("REDIS_STARTED_HERE=1 stop_redis")

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._start_reaper()
        self.start_postgres()
        self.start_redis()
        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=10) as connection:
            connection.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
            connection.execute(f"CREATE DATABASE {DATABASE}")
        manage(self, "migrate", "--verbosity", "0")
        manage(self, "shell", "--command", _USERS_SCRIPT)

    def stop(self) -> None:
        self.stop_redis()
        self.stop_postgres()
        if self._reaper is not None:
            self._reaper.terminate()
            self._reaper.wait(timeout=10)

    def _start_reaper(self) -> None:
        """Stops both servers once this process is gone or LIFETIME has passed, whichever first."""
        script = (
            f"end=$((SECONDS + {LIFETIME})); "
            f"while kill -0 {os.getpid()} 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 1; done; "
            "PG_STARTED_HERE=1 REDIS_STARTED_HERE=1; stop_redis; stop_postgres"
        )
        env = {
            **os.environ,
            "SERVICES_DIR": str(self.directory),
            "PG_PORT": str(self.pg_port),
            "REDIS_PORT": str(self.redis_port),
        }
        self._reaper = subprocess.Popen(
            ["bash", "-c", f"source '{SERVICES_SH}'; {script}"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # A Ctrl-C to the test run does not stop the clean-up.
        )


_USERS_SCRIPT = f"""
from django.contrib.auth.models import Group, User
for name, (staff, tenants) in {USERS!r}.items():
    user = User.objects.create_user(name, password={PASSWORD!r}, is_staff=staff)
    for tenant in tenants:
        user.groups.add(Group.objects.get_or_create(name="tenant:" + tenant)[0])
"""


def manage(services: Services, *args: str) -> None:
    """Run a management command of the demo project against this run's database."""
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=demo_environment(services),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise ServiceError(f"manage.py {' '.join(args)} failed:\n{result.stderr}")


def demo_environment(services: Services, **settings: str) -> dict[str, str]:
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("IDEMPOTENCY_", "DJANGO_", "PG_", "COVERAGE"))
    }
    return {
        **environment,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        # DEBUG on: a 500 would carry its traceback into the failure report.
        "DJANGO_DEBUG": "1",
        "DATABASE_URL": services.database_url,
        "REDIS_URL": services.redis_url,
        "PYTHONDONTWRITEBYTECODE": "1",
        **settings,
    }


class Database:
    """Reads (and, for a test's set-up, writes) the demo's tables; a new connection each time."""

    def __init__(self, url: str) -> None:
        self.url = url

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as connection:
            cursor = connection.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def value(self, sql: str, *params: Any) -> Any:
        rows = self.rows(sql, *params)
        return rows[0][0] if rows else None

    def executions(self, prefix: str) -> dict[str, int]:
        """Payments the views created, per description (the key each test writes into it)."""
        return dict(
            self.rows(
                "SELECT description, count(*) FROM payments_payment "
                "WHERE description LIKE %s GROUP BY description",
                prefix + "%",
            )
        )

    def records(self, namespace: str, prefix: str = "") -> dict[tuple[str, str], tuple[Any, ...]]:
        """(owner, key) -> (status, response_status, response_body, lease_token) of a namespace."""
        rows = self.rows(
            "SELECT owner, key, status, response_status, response_body, lease_token "
            "FROM django_idempotency_record WHERE namespace = %s AND key LIKE %s",
            namespace,
            prefix + "%",
        )
        return {
            (owner, key): (status, code, bytes(body) if body is not None else None, token)
            for owner, key, status, code, body, token in rows
        }


Serve = Callable[..., AbstractContextManager["Server"]]


class Server:
    """testproject served by gunicorn (3 gthread workers) on a free loopback port."""

    workers = 3
    threads = 8

    def __init__(self, name: str, services: Services, log_dir: Path, **settings: str) -> None:
        self.name = name
        self.environment = demo_environment(services, **settings)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log_dir / f"gunicorn-{name}.log"
        self.pidfile = log_dir / f"gunicorn-{name}.pid"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command: Sequence[str] = [
            "timeout", "--kill-after=10", str(LIFETIME),
            sys.executable, "-m", "gunicorn", "testproject.wsgi",
            "--workers", str(self.workers), "--worker-class", "gthread",
            "--threads", str(self.threads), "--backlog", "512",
            "--bind", f"127.0.0.1:{self.port}", "--pid", str(self.pidfile),
            "--graceful-timeout", "5", "--log-level", "warning",
        ]  # fmt: skip
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                command,
                cwd=ROOT,
                env=self.environment,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Its own process group: stopped as one.
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServiceError(f"gunicorn ({self.name}) exited:\n{self.error_log()}")
            try:
                with urllib.request.urlopen(self.url + "/api/", timeout=2) as response:
                    if response.status == 200 and len(self.worker_pids()) == self.workers:
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.2)
        self.stop()
        raise ServiceError(f"gunicorn ({self.name}) did not answer in 60 s:\n{self.error_log()}")

    def stop(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    def error_log(self) -> str:
        return self.log.read_text(errors="replace")[-20_000:] if self.log.exists() else ""

    def master_pid(self) -> int:
        return int(self.pidfile.read_text().strip())

    def worker_pids(self) -> list[int]:
        try:
            master = self.master_pid()
        except (OSError, ValueError):
            return []
        return [pid for pid, parent in _processes() if parent == master]

    def worker_serving(self, client: socket.socket) -> int | None:
        """The worker holding the server side of this client's connection, from /proc."""
        client_port = client.getsockname()[1]
        inode = None
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            local, remote = fields[1], fields[2]
            if int(local.split(":")[1], 16) == self.port and int(remote.split(":")[1], 16) == (
                client_port
            ):
                inode = fields[9]
        if inode is None:
            return None
        target = f"socket:[{inode}]"
        for pid in self.worker_pids():
            with contextlib.suppress(OSError):
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    with contextlib.suppress(OSError):
                        if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                            return pid
        return None


def _processes() -> Iterator[tuple[int, int]]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                # The command name may hold spaces and parentheses: fields follow the last ")".
                yield int(entry), int(stat.rsplit(")", 1)[1].split()[1])


@dataclass
class Figure:
    """One measured run of a scenario, as printed at the end of the session."""

    scenario: str
    variant: str
    requests: int
    absorbed: int = 0
    executions: str = ""
    server_errors: int = 0
    seconds: float = 0.0
    notes: str = ""


@dataclass
class Figures:
    rows: list[Figure] = field(default_factory=list)

    def add(self, figure: Figure) -> Figure:
        self.rows.append(figure)
        return figure
