"""Demo settings: SQLite by default, PostgreSQL or MariaDB when DATABASE_URL is set."""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url
import django

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "demo-only-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "testproject.urls"
WSGI_APPLICATION = "testproject.wsgi.application"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "static/"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "django_idempotency",
    "testproject.payments",
    "testproject.bank",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
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
            ]
        },
    }
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL") or f"sqlite:///{BASE_DIR / 'db.sqlite3'}",
        conn_max_age=int(os.environ.get("CONN_MAX_AGE", "0")),
    )
}
if os.environ.get("PGBOUNCER") == "1" and DATABASES["default"]["ENGINE"].endswith("postgresql"):
    # DATABASE_URL is a PgBouncer in transaction pooling: no server-side cursors (Django's
    # setting for it, which the idempotency store also reads) and no prepared statements
    # (psycopg's; None is Django's default too).
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
    DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = None
if DATABASES["default"]["ENGINE"].endswith("mysql"):
    # MariaDB (mysql://...): Django's MySQL backend talks utf8 (3-byte UTF-8) unless told; keys
    # and bodies may hold any character.
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("charset", "utf8mb4")

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.BasicAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.AllowAny"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
# The OpenAPI schema at /api/schema/, Swagger UI at /api/docs/ (docs/openapi.md).
SPECTACULAR_SETTINGS = {"TITLE": "django-idempotency demo", "VERSION": "0.1.0"}

# django-idempotency: keys are optional by default; the payments endpoints require them.
# Each can be set from the environment when serving the demo (tests/reliability does).
IDEMPOTENCY_TTL = float(os.environ.get("IDEMPOTENCY_TTL", 24 * 60 * 60))
IDEMPOTENCY_MODE = os.environ.get("IDEMPOTENCY_MODE", "atomic")
IDEMPOTENCY_ON_CONFLICT = os.environ.get("IDEMPOTENCY_ON_CONFLICT", "reject")
IDEMPOTENCY_LEASE = float(os.environ.get("IDEMPOTENCY_LEASE", 60))
IDEMPOTENCY_LEASE_RENEWAL = os.environ.get("IDEMPOTENCY_LEASE_RENEWAL", "1") == "1"
# Keys shared by a tenant's members (X-Tenant header):
# IDEMPOTENCY_OWNER_RESOLVER=testproject.payments.owners.tenant_owner
IDEMPOTENCY_OWNER_RESOLVER = (
    os.environ.get("IDEMPOTENCY_OWNER_RESOLVER")
    or "django_idempotency.http.owners.authenticated_user"
)

# The cache tier, when a Redis is at hand: IDEMPOTENCY_CACHE=idempotency REDIS_URL=redis://...
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
if os.environ.get("REDIS_URL"):
    CACHES["idempotency"] = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ["REDIS_URL"].rstrip("/") + "/3",
        # Fail fast when Redis is gone: the tier falls back to the database.
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.2, "SOCKET_TIMEOUT": 0.2},
    }
# The same alias on a Redis Cluster: REDIS_CLUSTER_URL=redis://<any node>
if os.environ.get("REDIS_CLUSTER_URL"):
    CACHES["idempotency"] = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ["REDIS_CLUSTER_URL"],
        # Longer than IDEMPOTENCY_REDIS_WAIT_TIMEOUT: a read cut short would answer 503.
        "OPTIONS": {
            "CLIENT_CLASS": "django_idempotency.contrib.redis_cluster.RedisClusterClient",
            "SOCKET_CONNECT_TIMEOUT": 0.2,
            "SOCKET_TIMEOUT": 2,
        },
    }
IDEMPOTENCY_REDIS_WAIT_REPLICAS = int(os.environ.get("IDEMPOTENCY_REDIS_WAIT_REPLICAS", 0))
IDEMPOTENCY_REDIS_WAIT_TIMEOUT = float(os.environ.get("IDEMPOTENCY_REDIS_WAIT_TIMEOUT", 1))
IDEMPOTENCY_CACHE = os.environ.get("IDEMPOTENCY_CACHE") or None
# Records in Redis instead of the database (lease mode only): IDEMPOTENCY_MODE=lease
# IDEMPOTENCY_STORE=django_idempotency.stores.redis.RedisStore REDIS_URL=redis://...
if os.environ.get("IDEMPOTENCY_STORE"):
    IDEMPOTENCY_STORE = os.environ["IDEMPOTENCY_STORE"]
    IDEMPOTENCY_REDIS_CACHE = "idempotency"

# The payment provider's webhook signing secret (Standard Webhooks), and the bank API the
# settlements call (empty: the demo answers for the bank itself).
PAYMENTS_WEBHOOK_SECRET = os.environ.get(
    "PAYMENTS_WEBHOOK_SECRET", "whsec_ZGVtby1vbmx5LW5vdC1hLXJlYWwtc2lnbmluZy1rZXk="
)
BANK_API_URL = os.environ.get("BANK_API_URL", "")
# Where the shop's orders are shipped from: the warehouse the outbox's relay posts them to, by
# default this demo's own under `manage.py runserver`.
DEMO_WAREHOUSE_URL = os.environ.get(
    "DEMO_WAREHOUSE_URL", "http://127.0.0.1:8000/warehouse/shipments/"
)
# Seconds the shop's checkout takes to pay (the provider's time): long enough to click twice.
SHOP_PAYMENT_SECONDS = float(os.environ.get("SHOP_PAYMENT_SECONDS", "0.5"))
# Test-only: the payouts' crash points (testproject/payments/crashes.py), off unless set.
DEMO_CRASH_POINTS = os.environ.get("DEMO_CRASH_POINTS", "")
DEMO_CRASH_SEED = os.environ.get("DEMO_CRASH_SEED", "0")
DEMO_CRASH_DIR = os.environ.get("DEMO_CRASH_DIR", "")
# The receipts are printed. Django 6.1 configures email with MAILERS and deprecates EMAIL_BACKEND.
CONSOLE_MAIL = "django.core.mail.backends.console.EmailBackend"
if django.VERSION >= (6, 1):
    MAILERS = {"default": {"BACKEND": CONSOLE_MAIL}}
else:
    EMAIL_BACKEND = CONSOLE_MAIL

# Celery, when installed (`celery -A testproject worker --beat`): Redis as broker and result store.
CELERY_BROKER_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:63799/0")
CELERY_RESULT_BACKEND = CELERY_BROKER_URL
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
if os.environ.get("CELERY_VISIBILITY_TIMEOUT"):
    # How soon a message left unacknowledged (acks_late, its worker killed) is delivered again:
    # an hour by default; the reliability suite shortens it, and looks for such messages every
    # second.
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": float(os.environ["CELERY_VISIBILITY_TIMEOUT"]),
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    }
CELERY_BEAT_SCHEDULE = {
    "purge-expired-idempotency-records": {
        "task": "django_idempotency.tasks.purge_expired_records",
        "schedule": 3600,  # Hourly; the purge runs in short batches beside live traffic.
    },
    "relay-idempotency-outbox": {
        "task": "django_idempotency.tasks.relay_outbox",
        "schedule": 5,  # The shop's e-mails and shipments leave seconds after the payment.
    },
}
