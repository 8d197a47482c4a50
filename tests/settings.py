"""Test settings: SQLite by default, PostgreSQL when DATABASE_URL is set."""

from __future__ import annotations

import copy
import os

import dj_database_url
import django

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = os.environ.get("USE_TZ", "1") != "0"  # USE_TZ=0: the suite without time zones.
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.urls"
STATIC_URL = "/static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.messages",
    "django.contrib.sessions",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",  # Its token view: a credential view the guard never stores.
    "django_idempotency",
    "tests",
    "testproject.payments",  # The demo's examples are tested against the test database too.
    "testproject.bank",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    # An empty DATABASE_URL (tox's SQLite envs) means SQLite too.
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL") or "sqlite:///test-idempotency.sqlite3"
    ),
}
if os.environ.get("PGBOUNCER") == "1" and DATABASES["default"]["ENGINE"].endswith("postgresql"):
    # DATABASE_URL is a PgBouncer in transaction pooling: what Django and psycopg document for
    # it (no server-side cursors, no prepared statements), as a project behind one sets them.
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
    DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = None
if DATABASES["default"]["ENGINE"].endswith("mysql"):  # MariaDB: keys are stored as utf8mb4.
    DATABASES["default"].setdefault("OPTIONS", {})["charset"] = "utf8mb4"
    DATABASES["default"]["TEST"] = {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_unicode_ci"}
# A second database, for the tests of records kept apart from the views' data
# (IDEMPOTENCY_DATABASE = "records"); only the tests that ask for it create its test database.
DATABASES["records"] = copy.deepcopy(DATABASES["default"])
DATABASES["records"]["NAME"] = (
    "test-idempotency-records.sqlite3"
    if DATABASES["default"]["ENGINE"].endswith("sqlite3")
    else f"{DATABASES['default']['NAME']}_records"
)
# A streaming replica of the default PostgreSQL (PG_REPLICA_URL, which scripts/services.sh sets),
# for the tests of reads a router sends to a replica (tests/test_replica.py). Its test database
# is the default's, arriving by replication: as a test MIRROR the test runner neither creates nor
# flushes it, and points it at the default's test database NAME, on the replica's server.
if os.environ.get("PG_REPLICA_URL") and DATABASES["default"]["ENGINE"].endswith("postgresql"):
    _replica_server = dj_database_url.parse(os.environ["PG_REPLICA_URL"])
    DATABASES["replica"] = copy.deepcopy(DATABASES["default"])
    DATABASES["replica"]["HOST"] = _replica_server["HOST"]
    DATABASES["replica"]["PORT"] = _replica_server["PORT"]
    DATABASES["replica"]["TEST"] = {"MIRROR": "default"}
# SQLite's test database is a file, not memory (connections can then be closed, reopened and
# shared across threads), named per process when the test database is set up: see
# django_db_modify_db_settings in tests/conftest.py.

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.SessionAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.AllowAny"],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
if django.VERSION >= (6, 1):
    # Django 6.1 configures email with MAILERS (the test runner swaps each for the in-memory one);
    # without one, every mail sent warns that Django 2028 will have no default.
    MAILERS: dict[str, dict[str, str]] = {"default": {}}

IDEMPOTENCY_WAIT_TIMEOUT = 5

# What the demo's examples read (testproject/settings.py sets them for the demo).
PAYMENTS_WEBHOOK_SECRET = "whsec_dGVzdHMtb25seS1wcm92aWRlci1zZWNyZXQ="
BANK_API_URL = ""
SHOP_PAYMENT_SECONDS = 0.0  # The browser tests set a second: two clicks while it pays.
DEMO_CRASH_POINTS = ""
DEMO_CRASH_SEED = "0"
DEMO_CRASH_DIR = ""
