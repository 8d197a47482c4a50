"""Typed access to the IDEMPOTENCY_* settings: read once, read again when a setting changes."""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import timedelta
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Any, Literal, cast

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from django_idempotency.core.keys import KEY_FORMATS, KeyFormat
from django_idempotency.encryption import fernet_for
from django_idempotency.exceptions import AppNotInstalled

# Re-exported: the settings share the options' vocabulary and checks, long imported from here.
from django_idempotency.options import HEADER_NAME as HEADER_NAME
from django_idempotency.options import MODES as MODES
from django_idempotency.options import ON_CONFLICT as ON_CONFLICT
from django_idempotency.options import OPTION
from django_idempotency.options import Mode as Mode
from django_idempotency.options import OnConflict as OnConflict
from django_idempotency.options import choice as choice
from django_idempotency.options import to_bool as to_bool
from django_idempotency.options import to_timedelta as to_timedelta

if TYPE_CHECKING:
    from cryptography.fernet import MultiFernet
    from django.http import HttpRequest

# The settings naming a callable or class by its dotted path, and what each defaults to.
DEFAULT_PATHS = {
    "OWNER_RESOLVER": "django_idempotency.http.owners.authenticated_user",
    "FINGERPRINT": "django_idempotency.http.requests.request_fingerprint",
    "STORE": "django_idempotency.stores.database.DatabaseStore",
}
ErrorFormat = Literal["problem", "drf", "ninja"]
ERROR_FORMATS: tuple[ErrorFormat, ...] = ("problem", "drf", "ninja")
# RFC 4151 tag URIs name each problem type without promising a page behind it (RFC 9457 3.1.1).
DEFAULT_PROBLEM_BASE_URL = "tag:django-idempotency.github.io,2026:"
# The page each problem response links to (`Link: <…#slug>; rel="describedby"`): the
# project's published Errors page, each of whose sections is anchored by its slug.
DEFAULT_DOCS_URL = (
    "https://github.com/django-idempotency/django-idempotency/blob/main/docs/errors.md"
)
MAX_STORED_BYTES = 1024 * 1024  # A response body larger than this is not kept for replays.


def to_byte_count(value: Any, name: str) -> int | None:
    """A size in bytes: an int of zero or more, or None for no limit."""
    if value is None or (type(value) is int and value >= 0):
        return value
    raise ImproperlyConfigured(
        f"{name} must be a number of bytes (an int of 0 or more) or None, not {value!r}."
    )


def to_count(value: Any, name: str) -> int:
    """A count: an int of zero or more."""
    if type(value) is int and value >= 0:
        return value
    raise ImproperlyConfigured(f"{name} must be a number (an int of 0 or more), not {value!r}.")


def load_callable(value: str | Callable[..., Any], name: str) -> Callable[..., Any]:
    if callable(value):
        return value
    if not isinstance(value, str):
        raise ImproperlyConfigured(f"{name} must be a dotted path or a callable, not {value!r}.")
    try:
        return _imported(value)
    except ImportError as exc:
        raise ImproperlyConfigured(f"{name} = {value!r} cannot be imported: {exc}") from exc


@lru_cache(maxsize=64)
def _imported(dotted_path: str) -> Callable[..., Any]:
    """Import once per path, so changing a setting back does not import it again."""
    return cast("Callable[..., Any]", import_string(dotted_path))


class Settings:
    """Every setting with its default, validated on first use and then kept.

    A request reads a dozen settings; looking each up in Django's settings and validating it
    again every time was a measurable share of a replay. `reload` (connected to Django's
    `setting_changed`, which `override_settings` and pytest-django's `settings` send) forgets
    them.
    """

    def _get(self, name: str, default: Any) -> Any:
        return getattr(django_settings, name, default)

    def _option(self, name: str) -> tuple[Any, str]:
        """The setting the option `name` falls back to: its value (else the option's default)
        and its name, for messages. The options table declares both."""
        option = OPTION[name]
        assert option.setting is not None
        return self._get(option.setting, option.default), option.setting

    def reload(self) -> None:
        """Forget every value read so far."""
        self.__dict__.clear()

    @cached_property
    def ENABLED(self) -> bool:
        return to_bool(self._get("IDEMPOTENCY_ENABLED", True), "IDEMPOTENCY_ENABLED")

    @cached_property
    def HEADER(self) -> str:
        value, _ = self._option("header")
        return str(value)

    @cached_property
    def FORM_FIELD(self) -> str | None:
        """The form field an HTML form carries the key in, read when no header is sent; None:
        keys come in the header only."""
        value = self._get("IDEMPOTENCY_FORM_FIELD", "idempotency_key")
        return None if value is None else str(value)

    @cached_property
    def METHODS(self) -> tuple[str, ...]:
        value = self._get("IDEMPOTENCY_METHODS", ("POST", "PATCH"))
        return tuple(m.upper() for m in ([value] if isinstance(value, str) else value))

    @cached_property
    def REQUIRED(self) -> bool:
        value, setting = self._option("required")
        return to_bool(value, setting)

    @cached_property
    def TTL(self) -> timedelta:
        value, setting = self._option("ttl")
        return to_timedelta(value, setting)

    @cached_property
    def MODE(self) -> Mode:
        value, setting = self._option("mode")
        return cast(Mode, choice(value, MODES, setting))

    @cached_property
    def ON_CONFLICT(self) -> OnConflict:
        value, setting = self._option("on_conflict")
        return cast(OnConflict, choice(value, ON_CONFLICT, setting))

    @cached_property
    def LEASE(self) -> timedelta:
        value, setting = self._option("lease")
        return to_timedelta(value, setting)

    @cached_property
    def LEASE_RENEWAL(self) -> bool:
        return to_bool(self._get("IDEMPOTENCY_LEASE_RENEWAL", True), "IDEMPOTENCY_LEASE_RENEWAL")

    @cached_property
    def WAIT_TIMEOUT(self) -> timedelta:
        return to_timedelta(self._get("IDEMPOTENCY_WAIT_TIMEOUT", 10), "IDEMPOTENCY_WAIT_TIMEOUT")

    @cached_property
    def NAMESPACE(self) -> str:
        value, _ = self._option("namespace")
        return str(value)

    @cached_property
    def KEY_FORMAT(self) -> KeyFormat | None:
        value = self._get("IDEMPOTENCY_KEY_FORMAT", None)
        if value is None:
            return None
        return cast(KeyFormat, choice(value, KEY_FORMATS, "IDEMPOTENCY_KEY_FORMAT"))

    @cached_property
    def OWNER_RESOLVER(self) -> Callable[[HttpRequest], str]:
        value = self._get("IDEMPOTENCY_OWNER_RESOLVER", DEFAULT_PATHS["OWNER_RESOLVER"])
        return load_callable(value, "IDEMPOTENCY_OWNER_RESOLVER")

    @cached_property
    def FINGERPRINT(self) -> Callable[[HttpRequest], str]:
        value = self._get("IDEMPOTENCY_FINGERPRINT", DEFAULT_PATHS["FINGERPRINT"])
        return load_callable(value, "IDEMPOTENCY_FINGERPRINT")

    @cached_property
    def FINGERPRINT_IGNORE_FIELDS(self) -> Collection[str]:
        return frozenset(self._get("IDEMPOTENCY_FINGERPRINT_IGNORE_FIELDS", ()))

    @cached_property
    def STORED_CLIENT_ERRORS(self) -> Collection[int]:
        return frozenset(self._get("IDEMPOTENCY_STORED_CLIENT_ERRORS", (402,)))

    @cached_property
    def STORE_SERVER_ERRORS(self) -> bool:
        return to_bool(
            self._get("IDEMPOTENCY_STORE_SERVER_ERRORS", False), "IDEMPOTENCY_STORE_SERVER_ERRORS"
        )

    @cached_property
    def STORE(self) -> str:
        return str(self._get("IDEMPOTENCY_STORE", DEFAULT_PATHS["STORE"]))

    @cached_property
    def CACHE(self) -> str | None:
        value = self._get("IDEMPOTENCY_CACHE", None)
        return str(value) if value else None  # "" (e.g. from an empty env var) means none.

    @cached_property
    def REDIS_CACHE(self) -> str:
        """The django-redis cache alias whose connection the Redis store uses."""
        return str(self._get("IDEMPOTENCY_REDIS_CACHE", "default"))

    @cached_property
    def REDIS_WAIT_REPLICAS(self) -> int:
        """The Redis store only: how many replicas must acknowledge a claim and a stored
        response (Redis's WAIT) before the view runs and before the response is sent; 0: none."""
        value = self._get("IDEMPOTENCY_REDIS_WAIT_REPLICAS", 0)
        return to_count(value, "IDEMPOTENCY_REDIS_WAIT_REPLICAS")

    @cached_property
    def REDIS_WAIT_TIMEOUT(self) -> timedelta:
        """How long WAIT waits for IDEMPOTENCY_REDIS_WAIT_REPLICAS replicas."""
        value = self._get("IDEMPOTENCY_REDIS_WAIT_TIMEOUT", 1)
        return to_timedelta(value, "IDEMPOTENCY_REDIS_WAIT_TIMEOUT")

    @cached_property
    def DATABASE(self) -> str | None:
        value = self._get("IDEMPOTENCY_DATABASE", None)
        return None if value is None else str(value)

    @cached_property
    def METRICS(self) -> bool:
        return to_bool(self._get("IDEMPOTENCY_METRICS", True), "IDEMPOTENCY_METRICS")

    @cached_property
    def TRACING(self) -> bool:
        return to_bool(self._get("IDEMPOTENCY_TRACING", True), "IDEMPOTENCY_TRACING")

    @cached_property
    def PROBLEM_BASE_URL(self) -> str:
        return str(self._get("IDEMPOTENCY_PROBLEM_BASE_URL", DEFAULT_PROBLEM_BASE_URL))

    @cached_property
    def DOCS_URL(self) -> str | None:
        value = self._get("IDEMPOTENCY_DOCS_URL", DEFAULT_DOCS_URL)
        if value is not None and not (isinstance(value, str) and value):
            raise ImproperlyConfigured(
                f"IDEMPOTENCY_DOCS_URL must be the address of a page documenting the errors "
                f"(or None for no link), not {value!r}."
            )
        return value

    @cached_property
    def ERROR_FORMAT(self) -> ErrorFormat:
        value = self._get("IDEMPOTENCY_ERROR_FORMAT", "problem")
        return cast(ErrorFormat, choice(value, ERROR_FORMATS, "IDEMPOTENCY_ERROR_FORMAT"))

    @cached_property
    def MAX_STORED_BYTES(self) -> int | None:
        value = self._get("IDEMPOTENCY_MAX_STORED_BYTES", MAX_STORED_BYTES)
        return to_byte_count(value, "IDEMPOTENCY_MAX_STORED_BYTES")

    @cached_property
    def ENCRYPTION_KEYS(self) -> MultiFernet | None:
        """What seals stored responses (newest key first), or None to store them in clear."""
        value = self._get("IDEMPOTENCY_ENCRYPTION_KEYS", None)
        if value is None:
            return None
        return fernet_for(value, "IDEMPOTENCY_ENCRYPTION_KEYS")

    @cached_property
    def GUARD_ALL_VIEWS(self) -> bool:
        value = self._get("IDEMPOTENCY_GUARD_ALL_VIEWS", False)
        return to_bool(value, "IDEMPOTENCY_GUARD_ALL_VIEWS")

    @cached_property
    def EXEMPT_VIEWS(self) -> tuple[str, ...]:
        """Dotted paths of views (classes or functions) that the middleware and the project-wide
        guard leave alone, besides `http.exempt.CREDENTIAL_VIEWS`."""
        value = self._get("IDEMPOTENCY_EXEMPT_VIEWS", ())
        # A bare string would count as its single characters: refused with the rest.
        listed = isinstance(value, Collection) and not isinstance(value, str | bytes | dict)
        if not listed or not all(isinstance(path, str) for path in value):
            raise ImproperlyConfigured(
                f"IDEMPOTENCY_EXEMPT_VIEWS must be a list of dotted paths, not {value!r}."
            )
        return tuple(value)

    @cached_property
    def ADMIN(self) -> bool:
        return to_bool(self._get("IDEMPOTENCY_ADMIN", True), "IDEMPOTENCY_ADMIN")


# Every setting this app reads, for the check that spots a misspelt one.
SETTING_NAMES = frozenset(
    f"IDEMPOTENCY_{name}"
    for name, value in vars(Settings).items()
    if isinstance(value, cached_property)
)


conf = Settings()


NOT_INSTALLED = (
    'django_idempotency is not in INSTALLED_APPS: add "django_idempotency" to INSTALLED_APPS,'
    " then run `python manage.py migrate django_idempotency`."
)
_installed = False  # Once seen installed, the registry is not asked again on each request.


def require_installed() -> None:
    """Raise AppNotInstalled (an ImproperlyConfigured) saying how to fix it when the app is not
    installed, rather than let the first keyed request fail on the model ("isn't in an
    application in INSTALLED_APPS").

    Only once the app registry is ready: before that, nothing can be known yet."""
    global _installed
    if _installed:
        return
    from django.apps import apps

    if not apps.ready:
        return
    if not apps.is_installed("django_idempotency"):
        raise AppNotInstalled(NOT_INSTALLED)
    _installed = True


def reload_on_change(*, setting: str, **kwargs: Any) -> None:
    """`setting_changed` receiver: an IDEMPOTENCY_* setting changed, read them all again."""
    if setting.startswith("IDEMPOTENCY_"):
        conf.reload()
