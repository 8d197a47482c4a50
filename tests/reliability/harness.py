"""The reliability run's own database (PostgreSQL or MariaDB) and Redis, the demo under gunicorn
on the store of the run (the database or Redis), and its figures."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import psycopg
import redis

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


# The database the suite runs against: RELIABILITY_DATABASE=postgresql (the default) or mariadb.
DATABASES = {"postgresql": "PostgreSQL", "mariadb": "MariaDB"}


# What stands between the demo and PostgreSQL: RELIABILITY_POOLER=pgbouncer puts a PgBouncer of
# the run in transaction pooling there (scripts/services.sh's start_pgbouncer); none by default.
POOLERS = {"none": "", "pgbouncer": "PgBouncer (transaction pooling)"}


# The store the demo keeps its records in: RELIABILITY_STORE=database (the default) or redis.
STORES = {"database": "database", "redis": "Redis"}
REDIS_STORE = "django_idempotency.stores.redis.RedisStore"
# The demo's django-redis alias "idempotency" (testproject/settings.py): REDIS_URL, database 3.
REDIS_STORE_DB = 3


class ServiceError(RuntimeError):
    """A server the suite needs could not be started: the run fails, it is never skipped."""


def chosen_database() -> str:
    """RELIABILITY_DATABASE, checked: a misspelt name fails the run rather than test another."""
    name = os.environ.get("RELIABILITY_DATABASE", "").strip().lower() or "postgresql"
    if name not in DATABASES:
        raise ServiceError(
            f"RELIABILITY_DATABASE={name!r}: the reliability suite runs on "
            f"{' or '.join(DATABASES)}."
        )
    return name


def chosen_pooler() -> str:
    """RELIABILITY_POOLER, checked like RELIABILITY_DATABASE."""
    name = os.environ.get("RELIABILITY_POOLER", "").strip().lower() or "none"
    if name not in POOLERS:
        raise ServiceError(
            f"RELIABILITY_POOLER={name!r}: the reliability suite runs with "
            f"{' or '.join(POOLERS)} in front of PostgreSQL."
        )
    if name != "none" and chosen_database() != "postgresql":
        raise ServiceError(f"RELIABILITY_POOLER={name!r} pools PostgreSQL connections only.")
    return name


def chosen_store() -> str:
    """RELIABILITY_STORE, checked like RELIABILITY_DATABASE."""
    name = os.environ.get("RELIABILITY_STORE", "").strip().lower() or "database"
    if name not in STORES:
        raise ServiceError(
            f"RELIABILITY_STORE={name!r}: the reliability suite runs on the "
            f"{' or the '.join(STORES)} store."
        )
    return name


def store_settings(store: str) -> dict[str, str]:
    """What every gunicorn of the run is served with on this store.

    The Redis store is lease mode only: IDEMPOTENCY_MODE=lease puts the views that take their
    mode from the setting (the "atomic" endpoints) in lease mode too.
    """
    if store == "redis":
        return {"IDEMPOTENCY_MODE": "lease", "IDEMPOTENCY_STORE": REDIS_STORE}
    return {}


def pgbouncer_version() -> str:
    """The PgBouncer scripts/services.sh starts, with its version, for the figures."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    result = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    return (result.stdout.splitlines() or ["PgBouncer"])[0]


def wait_until(condition_met: Callable[[], bool], seconds: float, what: str) -> None:
    """Poll every 50 ms; fail the test after `seconds`."""
    if not met_within(condition_met, seconds):
        raise AssertionError(f"Waited {seconds} s for {what}.")


def met_within(condition_met: Callable[[], bool], seconds: float) -> bool:
    """Poll every 50 ms for up to `seconds`: whether the condition was met."""
    deadline = time.monotonic() + seconds
    while not condition_met():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Services:
    """The database (PostgreSQL or MariaDB, by RELIABILITY_DATABASE) and the Redis of this run
    alone, started with scripts/services.sh.

    The suite stops and starts them mid-run, so they must not be the servers that the other
    test environments share.
    """

    directory: Path
    database: str = field(default_factory=chosen_database)
    store: str = field(default_factory=chosen_store)
    pooler: str = field(default_factory=chosen_pooler)
    pg_port: int = field(default_factory=free_port)
    pgbouncer_port: int = field(default_factory=free_port)
    mariadb_port: int = field(default_factory=free_port)
    redis_port: int = field(default_factory=free_port)
    _reaper: subprocess.Popen[bytes] | None = None
    _redis_aof_dir: Path | None = None

    @property
    def mariadb(self) -> bool:
        return self.database == "mariadb"

    @property
    def label(self) -> str:
        """The database's name in figures and messages."""
        return DATABASES[self.database]

    @property
    def admin_url(self) -> str:
        if self.mariadb:
            return f"mysql://root@127.0.0.1:{self.mariadb_port}"
        return f"postgresql://postgres@127.0.0.1:{self.pg_port}/postgres"

    @property
    def pgbouncer(self) -> bool:
        return self.pooler == "pgbouncer"

    @property
    def database_url(self) -> str:
        """The demo's database, as the demo reaches it: through PgBouncer when there is one."""
        if self.mariadb:
            return f"mysql://root@127.0.0.1:{self.mariadb_port}/{DATABASE}"
        port = self.pgbouncer_port if self.pgbouncer else self.pg_port
        return f"postgres://postgres@127.0.0.1:{port}/{DATABASE}"

    def create_database(self, name: str) -> str:
        """Create (again) another database on the run's server, for another service of the
        run, and return its URL (straight to the server, never through PgBouncer)."""
        admin = Database(self.admin_url)
        admin.rows(f"DROP DATABASE IF EXISTS {name}")
        admin.rows(f"CREATE DATABASE {name}" + (" CHARACTER SET utf8mb4" if self.mariadb else ""))
        if self.mariadb:
            return f"mysql://root@127.0.0.1:{self.mariadb_port}/{name}"
        return f"postgres://postgres@127.0.0.1:{self.pg_port}/{name}"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}"

    @property
    def _environment(self) -> dict[str, str]:
        return {
            **os.environ,
            "SERVICES_DIR": str(self.directory),
            "PG_PORT": str(self.pg_port),
            "MARIADB_PORT": str(self.mariadb_port),
            "REDIS_PORT": str(self.redis_port),
            "PGBOUNCER_PORT": str(self.pgbouncer_port),
        }

    @property
    def _database_service(self) -> str:
        """The name of the database's functions in scripts/services.sh: start_<name>, ..."""
        return "mariadb" if self.mariadb else "postgres"

    @property
    def _stop_database(self) -> str:
        # The server is this run's own: stop it whoever started it. PostgreSQL stops fast
        # (pg_ctl -m fast), MariaDB by mariadb-admin shutdown: both cut every client connection.
        flag = "MARIADB_STARTED_HERE" if self.mariadb else "PG_STARTED_HERE"
        return f"{flag}=1 stop_{self._database_service}"

    def _services(self, script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", f"source '{SERVICES_SH}'; {script}"],
            cwd=ROOT,
            env=self._environment,
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

    def start_database(self) -> None:
        self._start(f"start_{self._database_service}")

    def stop_database(self) -> None:
        self._services(self._stop_database)

    def restart_database(self) -> None:
        """Stop the database (every client connection is cut), start it again, and return once
        it accepts connections."""
        self.stop_database()
        self.start_database()
        # services.sh waits for the server to be ready; a client connecting proves it from outside.
        wait_until(self._database_accepts, 30, f"{self.label} to accept connections again")

    def _database_accepts(self) -> bool:
        try:
            Database(self.admin_url).rows("SELECT 1")
        except Database.errors():
            return False
        return True

    @property
    def redis_persistent(self) -> bool:
        """On the Redis store, Redis keeps the records: it must keep them across a restart."""
        return self.store == "redis"

    @property
    def _redis_dir(self) -> Path:
        """Where Redis keeps its files. The Redis store's append-only file is on tmpfs when there
        is one (/dev/shm): it survives Redis being killed and started again, which is what the
        suite does, and its fsync then costs microseconds. On a disk shared with other work an
        fsync may take longer than the demo's 0.2 s Redis socket timeout, and the store answers
        503 while Redis is up (docs/reliability.md)."""
        if not self.redis_persistent:
            return self.directory / "redis"  # scripts/services.sh's REDIS_DIR
        if self._redis_aof_dir is None:
            shm = Path("/dev/shm")
            parent = shm if shm.is_dir() and os.access(shm, os.W_OK) else self.directory
            self._redis_aof_dir = Path(
                tempfile.mkdtemp(prefix="idempotency-reliability-redis-", dir=parent)
            )
        return self._redis_aof_dir

    def start_redis(self) -> None:
        if not self.redis_persistent:
            self._start("start_redis")  # No persistence: the cache tier keeps nothing of its own.
            return
        if self._redis_answers():  # Already running, as start_redis leaves it too.
            return
        # The Redis store's records must outlive a restart, or every claim and stored response is
        # forgotten and each retry runs again (docs/stores.md, Durability): the append-only file,
        # fsynced before each write is acknowledged, so that even a SIGKILL loses no claim a
        # worker was told it holds. scripts/services.sh starts Redis without persistence, so
        # this Redis is started here, on the same port and directory (its stop_redis stops it).
        self._redis_dir.mkdir(parents=True, exist_ok=True)
        command = [
            "redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "yes", "--appendfsync", "always",
            "--daemonize", "yes", "--dir", str(self._redis_dir),
            "--pidfile", str(self._redis_dir / "redis.pid"),
            "--logfile", str(self._redis_dir / "redis.log"),
        ]  # fmt: skip
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=30)
        except FileNotFoundError as exc:
            raise ServiceError("redis-server not found: install Debian's redis-server") from exc
        if result.returncode != 0:
            raise ServiceError(f"redis-server failed: {result.stderr or result.stdout}")
        try:
            wait_until(self._redis_answers, 15, "Redis to load its append-only file")
        except AssertionError as exc:
            raise ServiceError(f"{exc} See {self._redis_dir / 'redis.log'}.") from exc

    def _redis_answers(self) -> bool:
        client = redis.Redis(host="127.0.0.1", port=self.redis_port, socket_timeout=1)
        try:
            return bool(client.ping())
        except redis.RedisError:  # Refused, or LOADING its append-only file.
            return False
        finally:
            client.close()

    def stop_redis(self) -> None:
        self._services("REDIS_STARTED_HERE=1 stop_redis")

    def kill_redis(self) -> None:
        """SIGKILL this run's Redis, as a crash would, and wait until it is gone."""
        pid = int((self._redis_dir / "redis.pid").read_text().strip())
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not Path(f"/proc/{pid}").exists(), 10, "Redis to die")
        with contextlib.suppress(OSError):  # Left behind by the SIGKILL.
            (self._redis_dir / "redis.pid").unlink()

    def redis_persistence(self) -> str:
        """How this run's Redis keeps its data: its AOF settings, read from the server."""
        client = redis.Redis(host="127.0.0.1", port=self.redis_port, socket_timeout=2)
        try:
            config = {**client.config_get("appendonly"), **client.config_get("appendfsync")}
            version = client.info("server")["redis_version"]
        finally:
            client.close()
        if config["appendonly"] != "yes":
            return f"Redis {version} (no persistence)"
        where = " on tmpfs" if str(self._redis_dir).startswith("/dev/shm/") else ""
        return f"Redis {version} (AOF{where}, appendfsync {config['appendfsync']})"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        # The database runs as its own system user when we are root (mkdtemp made this 0700).
        self.directory.chmod(0o755)
        self._start_reaper()
        self.start_database()
        if self.pgbouncer:  # In front of the database, as deployed; it outlives its restarts.
            self._start("start_pgbouncer")
        self.start_redis()
        admin = Database(self.admin_url)
        admin.rows(f"DROP DATABASE IF EXISTS {DATABASE}")
        if self.mariadb:  # Keys and bodies may hold any character: 4-byte UTF-8 included.
            admin.rows(f"CREATE DATABASE {DATABASE} CHARACTER SET utf8mb4")
        else:
            admin.rows(f"CREATE DATABASE {DATABASE}")
        manage(self, "migrate", "--verbosity", "0")
        manage(self, "shell", "--command", _USERS_SCRIPT)

    def stop(self) -> None:
        self.stop_redis()
        if self.pgbouncer:
            self._services("PGBOUNCER_STARTED_HERE=1 stop_pgbouncer")
        self.stop_database()
        if self._reaper is not None:
            self._reaper.terminate()
            self._reaper.wait(timeout=10)
        if self._redis_aof_dir is not None:
            shutil.rmtree(self._redis_aof_dir, ignore_errors=True)

    def _start_reaper(self) -> None:
        """Stops both servers once this process is gone or LIFETIME has passed, whichever first."""
        script = (
            f"end=$((SECONDS + {LIFETIME})); "
            f"while kill -0 {os.getpid()} 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 1; done; "
            f"REDIS_STARTED_HERE=1 stop_redis; PGBOUNCER_STARTED_HERE=1 stop_pgbouncer; "
            f"{self._stop_database}"
        )
        if self.redis_persistent:  # The append-only file, on tmpfs: memory until removed.
            script += f"; rm -rf '{self._redis_dir}'"
        self._reaper = subprocess.Popen(
            ["bash", "-c", f"source '{SERVICES_SH}'; {script}"],
            cwd=ROOT,
            env=self._environment,
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


def manage(services: Services, *args: str, **settings: str) -> None:
    """Run a management command of the demo project against this run's database (or with
    these settings, e.g. another DATABASE_URL)."""
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=demo_environment(services, **settings),
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
        if not key.startswith(("IDEMPOTENCY_", "DJANGO_", "PG_", "MARIADB_", "COVERAGE"))
    }
    return {
        **environment,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        # DEBUG on: a 500 would carry its traceback into the failure report.
        "DJANGO_DEBUG": "1",
        "DATABASE_URL": services.database_url,
        # Behind PgBouncer: what the demo's settings then set (testproject/settings.py).
        "PGBOUNCER": "1" if services.pgbouncer else "0",
        "REDIS_URL": services.redis_url,
        **settings,
    }


class Database:
    """Reads (and, for a test's set-up, writes) the demo's tables; a new connection each time.

    The same SQL on both databases: names that need quoting (`"key"`, reserved in MariaDB) are
    quoted the standard way, which MariaDB reads with ANSI_QUOTES, set on each connection with
    a UTC session time zone (`now()` is then the clock of the stored UTC datetimes). What has no
    common spelling (the server's own tables) has a method here.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.mariadb = url.startswith("mysql://")
        self.label = DATABASES["mariadb" if self.mariadb else "postgresql"]

    @staticmethod
    def errors() -> tuple[type[Exception], ...]:
        """What a connection to a stopped server raises, on either database."""
        errors: tuple[type[Exception], ...] = (psycopg.OperationalError,)
        with contextlib.suppress(ImportError):
            import MySQLdb

            errors += (MySQLdb.OperationalError,)
        return errors

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        if self.mariadb:
            return self._mariadb_rows(sql, params)
        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as connection:
            cursor = connection.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def _mariadb_rows(
        self, sql: str, params: tuple[Any, ...], *, read_uncommitted: bool = False
    ) -> list[tuple[Any, ...]]:
        import MySQLdb  # The mysql extra: only a MariaDB run needs it.

        session = "SET time_zone = '+00:00', sql_mode = 'ANSI_QUOTES'"
        if read_uncommitted:  # Other transactions' uncommitted rows too.
            session += ", tx_isolation = 'READ-UNCOMMITTED'"

        url = urlsplit(self.url)
        connection = MySQLdb.connect(
            host=url.hostname or "127.0.0.1",
            port=url.port or 3306,
            user=unquote(url.username or "root"),
            password=unquote(url.password or ""),
            database=url.path.lstrip("/"),
            charset="utf8mb4",
            autocommit=True,
            connect_timeout=5,
            init_command=session,
        )
        with contextlib.closing(connection), connection.cursor() as cursor:
            # No parameters: the statement as it is (MySQLdb would read its "%" as a format).
            cursor.execute(sql, params or None)
            return list(cursor.fetchall()) if cursor.description else []

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
            'SELECT owner, "key", status, response_status, response_body, lease_token '
            'FROM django_idempotency_record WHERE namespace = %s AND "key" LIKE %s',
            namespace,
            prefix + "%",
        )
        return {
            (owner, key): (status, code, bytes(body) if body is not None else None, token)
            for owner, key, status, code, body, token in rows
        }

    def version(self) -> str:
        """The server's name and version, for the figures."""
        if self.mariadb:
            return "MariaDB " + str(self.value("SELECT VERSION()")).split("-")[0]
        return "PostgreSQL " + str(self.value("SHOW server_version")).split()[0]

    def started_at(self) -> Any:
        """When the server started: a restart changes it."""
        if self.mariadb:
            return self.value(
                "SELECT UNIX_TIMESTAMP() - VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS "
                "WHERE VARIABLE_NAME = 'UPTIME'"
            )
        return self.value("SELECT pg_postmaster_start_time()")

    def client_connections(self) -> int:
        """The demo's connections to its database: every client connection but this one."""
        if self.mariadb:
            sql = (
                "SELECT count(*) FROM information_schema.PROCESSLIST "
                "WHERE DB = DATABASE() AND ID <> CONNECTION_ID()"
            )
        else:
            sql = (
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
            )
        return int(self.value(sql))

    def deadlocks(self) -> int:
        """Deadlocks the server has broken so far (by rolling a transaction back), reported to
        a client or not: InnoDB's count on MariaDB, the database's on PostgreSQL (its
        statistics may lag by a second)."""
        if self.mariadb:
            sql = (
                "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS "
                "WHERE VARIABLE_NAME = 'INNODB_DEADLOCKS'"
            )
        else:
            sql = "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        return int(self.value(sql))

    def open_claim(self, namespace: str, key: str) -> bool:
        """Whether a transaction still open holds a claim (atomic mode): on PostgreSQL, a key's
        advisory lock; on MariaDB, the key's record, inserted and not committed. (Not from
        INNODB_TRX: InnoDB refreshes that table only when it was not read for 0.1 s.)"""
        if not self.mariadb:
            return bool(self.value("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"))
        sql = 'SELECT count(*) FROM django_idempotency_record WHERE namespace = %s AND "key" = %s'
        uncommitted = self._mariadb_rows(sql, (namespace, key), read_uncommitted=True)[0][0]
        return bool(uncommitted) and not self.value(sql, namespace, key)


class RedisRecords:
    """Reads the Redis store's records, as Database.records reads the database store's: one
    hash per record in the demo's Redis database 3 (the key layout of docs/stores.md)."""

    label = "Redis"

    def __init__(self, redis_url: str) -> None:
        self.url = f"{redis_url}/{REDIS_STORE_DB}"

    @staticmethod
    def key(namespace: str, owner: str, key: str) -> str:
        digest = hashlib.sha256("\x00".join((namespace, owner, key)).encode()).hexdigest()
        return f":1:django_idempotency:1:{{{digest}}}"  # No KEY_PREFIX, VERSION 1.

    def records(self, namespace: str, prefix: str = "") -> dict[tuple[str, str], tuple[Any, ...]]:
        """(owner, key) -> (status, response_status, response_body, lease_token) of a namespace."""
        client = redis.Redis.from_url(self.url, socket_timeout=5)
        found: dict[tuple[str, str], tuple[Any, ...]] = {}
        try:
            for name in client.scan_iter(match=":1:django_idempotency:1:*", count=1000):
                raw: dict[bytes, bytes] = client.hgetall(name)  # type: ignore[assignment]
                fields = {field.decode(): value for field, value in raw.items()}
                text = {field: value.decode(errors="replace") for field, value in fields.items()}
                record_key, owner = text.get("key", ""), text.get("owner", "")
                if text.get("namespace") != namespace or not record_key.startswith(prefix):
                    continue
                assert name == self.key(namespace, owner, record_key).encode(), name
                code = text.get("response_status")
                found[(owner, record_key)] = (
                    text["status"],
                    int(code) if code is not None else None,
                    fields.get("response_body"),
                    text["lease_token"],
                )
        finally:
            client.close()
        return found


Records = Database | RedisRecords  # Where the run's store keeps the records: .records(...)


Serve = Callable[..., AbstractContextManager["Server"]]


class Server:
    """testproject served by gunicorn (3 gthread workers) on a free loopback port.

    The master loads the project before it forks the workers (`--preload`), as most deployments
    do: a worker killed mid-run is replaced by a fork in milliseconds, instead of a new process
    importing Django again (a second of CPU each, and the scenarios kill dozens)."""

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
            "--graceful-timeout", "5", "--log-level", "warning", "--preload",
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
    database: str = ""  # The server every figure was measured on, with its version.
    store: str = ""  # The store every figure was measured on: "database" or "Redis".
    store_server: str = ""  # The Redis store's server, with its version and persistence.

    def add(self, figure: Figure) -> Figure:
        self.rows.append(figure)
        return figure


# Where a failed scenario leaves what CI keeps (git-ignored): the servers' logs of the run.
ARTEFACTS = ROOT / ".artefacts" / "reliability"


def keep_artefact(path: Path) -> Path:
    """Copy `path` (a server's log) under ARTEFACTS, named by the time, and return the copy."""
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    kept = ARTEFACTS / f"{time.strftime('%Y%m%d-%H%M%S')}-{path.name}"
    if path.exists():
        shutil.copyfile(path, kept)
    else:
        kept.write_text(f"{path} was never written.\n")
    return kept
