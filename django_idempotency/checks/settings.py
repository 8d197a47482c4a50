"""`check_settings`: every IDEMPOTENCY_* value the app would reject at run time."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core import checks
from django.core.checks import CheckMessage, Error
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from django_idempotency.checks.ids import (
    DURATION_OUT_OF_RANGE,
    INVALID_BYTE_COUNT,
    INVALID_CHOICE,
    INVALID_COLLECTION,
    INVALID_DURATION,
    INVALID_ENCRYPTION_KEYS,
    INVALID_FORM_FIELD,
    INVALID_HEADER,
    INVALID_REPLICA_COUNT,
    MIDDLEWARE_NOT_LAST,
    NAMESPACE_TOO_LONG,
    NOT_A_BOOLEAN,
    NOT_CALLABLE,
    TTL_SHORTER_THAN_LEASE,
    UNKNOWN_SETTING,
)
from django_idempotency.checks.reading import _UNSET, _load, _seconds, _setting, unknown_methods
from django_idempotency.checks.stores import (
    _atomic_setting_on_lease_only_store,
    _cache,
    _database,
    _redis_cache,
    _store,
)
from django_idempotency.conf import (
    DEFAULT_PATHS,
    ERROR_FORMATS,
    HEADER_NAME,
    MODES,
    ON_CONFLICT,
    SETTING_NAMES,
    conf,
)
from django_idempotency.core.keys import KEY_FORMATS
from django_idempotency.http.requests import CSRF_FIELD
from django_idempotency.models import IdempotencyRecord

if TYPE_CHECKING:
    from django.apps import AppConfig


def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Every IDEMPOTENCY_* value the app would reject at run time, and caches that cannot share."""
    return [
        *_durations(),
        *_ttl_against_lease(),
        *_choices(),
        *_collections(),
        *_header(),
        *_form_field(),
        *_namespace(),
        *_callables(),
        *_store(),
        *_cache(),
        *_database(),
        *_booleans(),
        *_byte_counts(),
        *_replica_counts(),
        *_encryption_keys(),
        *_unknown_names(),
        *_middleware_order(),
        *_atomic_setting_on_lease_only_store(),
        *_redis_cache(),
    ]


def _durations() -> Iterable[CheckMessage]:
    # (attribute, whether zero is a valid value, what to do instead)
    rules: list[tuple[str, bool, str]] = [
        (
            "TTL",
            False,
            "Set IDEMPOTENCY_TTL to how long a retry may still be replayed, e.g."
            " timedelta(hours=24): with zero or less every record expires as soon as it is"
            " claimed, and retries run the view again.",
        ),
        (
            "LEASE",
            False,
            "Set IDEMPOTENCY_LEASE above the longest run of a lease-mode (or async) view, e.g."
            " 60 seconds: a lease of zero or less expires at once, so a retry can take over a"
            " request that is still running.",
        ),
        (
            "WAIT_TIMEOUT",
            True,
            "Set IDEMPOTENCY_WAIT_TIMEOUT to zero or more seconds: how long a duplicate waits"
            ' (on_conflict="wait") for the first request before it gets 409.',
        ),
        (
            "REDIS_WAIT_TIMEOUT",
            False,
            "Set IDEMPOTENCY_REDIS_WAIT_TIMEOUT to more than zero seconds, e.g. 1: how long the"
            " Redis store waits for its replicas (Redis's WAIT 0 would wait for ever).",
        ),
    ]
    for attribute, zero_allowed, hint in rules:
        name = f"IDEMPOTENCY_{attribute}"
        try:
            value: timedelta = getattr(conf, attribute)
        except ImproperlyConfigured as exc:
            yield Error(
                str(exc),
                hint=f"For example {name} = timedelta(seconds=60), or {name} = 60.",
                id=INVALID_DURATION,
            )
            continue
        except (ValueError, OverflowError) as exc:  # NaN, or more days than timedelta holds.
            yield Error(
                f"{name} = {_setting(name)!r} is not a usable duration: {exc}.",
                hint=f"For example {name} = timedelta(seconds=60), or {name} = 60.",
                id=INVALID_DURATION,
            )
            continue
        zero = timedelta(0)
        if value < zero or (value == zero and not zero_allowed):
            bound = "zero or more" if zero_allowed else "more than zero"
            yield Error(
                f"{name} = {_setting(name)!r} is {_seconds(value)}; it must be {bound}.",
                hint=hint,
                id=DURATION_OUT_OF_RANGE,
            )


def _ttl_against_lease() -> Iterable[CheckMessage]:
    try:
        ttl, lease = conf.TTL, conf.LEASE
    except (ImproperlyConfigured, ValueError, OverflowError):
        return  # E001 says why.
    if timedelta(0) < ttl < lease:
        yield checks.Warning(
            f"IDEMPOTENCY_TTL ({_seconds(ttl)}) is shorter than IDEMPOTENCY_LEASE"
            f" ({_seconds(lease)}).",
            hint="A running request keeps its key until its lease ends, even past the TTL, but"
            " a response stored after the TTL has already expired: its retry runs the view"
            " again. Keep IDEMPOTENCY_TTL above the longest run of a view (and the lease).",
            id=TTL_SHORTER_THAN_LEASE,
        )


def _choices() -> Iterable[CheckMessage]:
    rules: list[tuple[str, tuple[str | None, ...], str | None]] = [
        ("MODE", MODES, "atomic"),
        ("ON_CONFLICT", ON_CONFLICT, "reject"),
        ("KEY_FORMAT", (None, *KEY_FORMATS), None),
        ("ERROR_FORMAT", ERROR_FORMATS, "problem"),
    ]
    for attribute, allowed, default in rules:
        yield from _refused(
            attribute,
            f"Set IDEMPOTENCY_{attribute} to one of {', '.join(map(repr, allowed))}, or remove it"
            f" to use the default {default!r}.",
            INVALID_CHOICE,
        )


def _refused(attribute: str, hint: str, check_id: str) -> Iterable[CheckMessage]:
    """The app's own error for a setting it would refuse on first use, if it would."""
    try:
        getattr(conf, attribute)
    except ImproperlyConfigured as exc:
        yield Error(str(exc), hint=hint, id=check_id)


def _collections() -> Iterable[CheckMessage]:
    methods = _setting("IDEMPOTENCY_METHODS")
    if methods is not _UNSET and not _strings(methods, bare_string_allowed=True):
        yield Error(
            f"IDEMPOTENCY_METHODS = {methods!r} is not a method name or a sequence of them.",
            hint='For example IDEMPOTENCY_METHODS = ("POST", "PATCH").',
            id=INVALID_COLLECTION,
        )
    elif methods is not _UNSET:
        yield from unknown_methods("IDEMPOTENCY_METHODS", methods)
    ignored = _setting("IDEMPOTENCY_FINGERPRINT_IGNORE_FIELDS")
    if ignored is not _UNSET and not _strings(ignored, bare_string_allowed=False):
        yield Error(
            f"IDEMPOTENCY_FINGERPRINT_IGNORE_FIELDS = {ignored!r} is not a collection of field"
            " names.",
            hint='Use a list or tuple, e.g. IDEMPOTENCY_FINGERPRINT_IGNORE_FIELDS = ["nonce"]:'
            " a bare string would count as its single characters.",
            id=INVALID_COLLECTION,
        )
    exempt = _setting("IDEMPOTENCY_EXEMPT_VIEWS")
    if exempt is not _UNSET and not _strings(exempt, bare_string_allowed=False):
        yield Error(
            f"IDEMPOTENCY_EXEMPT_VIEWS = {exempt!r} is not a collection of dotted paths.",
            hint='Use a list, e.g. IDEMPOTENCY_EXEMPT_VIEWS = ["accounts.views.SignInView"]:'
            " a bare string would count as its single characters.",
            id=INVALID_COLLECTION,
        )
    statuses = _setting("IDEMPOTENCY_STORED_CLIENT_ERRORS")
    if statuses is not _UNSET and not _client_errors(statuses):
        yield Error(
            f"IDEMPOTENCY_STORED_CLIENT_ERRORS = {statuses!r} is not a collection of 4xx status"
            " codes.",
            hint="Use integers from 400 to 499, e.g. IDEMPOTENCY_STORED_CLIENT_ERRORS = (402,):"
            " other values never match a response and change nothing.",
            id=INVALID_COLLECTION,
        )


def _strings(value: Any, *, bare_string_allowed: bool) -> bool:
    if isinstance(value, str):
        return bare_string_allowed
    return _all_of(value, lambda item: isinstance(item, str))


def _client_errors(value: Any) -> bool:
    return not isinstance(value, str) and _all_of(
        value, lambda item: type(item) is int and 400 <= item <= 499
    )


def _all_of(value: Any, accept: Callable[[Any], bool]) -> bool:
    if isinstance(value, (bytes, dict)):  # Iterable, but never what the setting means.
        return False
    try:
        return all(accept(item) for item in value)
    except TypeError:  # Not iterable at all.
        return False


def _header() -> Iterable[CheckMessage]:
    header = _setting("IDEMPOTENCY_HEADER")
    if header is _UNSET or (isinstance(header, str) and HEADER_NAME.fullmatch(header)):
        return
    yield Error(
        f"IDEMPOTENCY_HEADER = {header!r} is not a valid HTTP header name.",
        hint="Use a header name of letters, digits and - (e.g. the default"
        ' "Idempotency-Key"), with no spaces, colons or other separators.',
        id=INVALID_HEADER,
    )


# A form field's name as the guard reads it: one a template and a form class write as it is.
FORM_FIELD_NAME = re.compile(r"[A-Za-z0-9_-]+")


def _form_field() -> Iterable[CheckMessage]:
    field = _setting("IDEMPOTENCY_FORM_FIELD")
    if field is _UNSET or field is None:
        return
    if isinstance(field, str) and FORM_FIELD_NAME.fullmatch(field) and field != CSRF_FIELD:
        return
    why = (
        "is the CSRF token's field, which cannot carry the key too"
        if field == CSRF_FIELD
        else "is not a form field name of letters, digits, _ and -"
    )
    yield Error(
        f"IDEMPOTENCY_FORM_FIELD = {field!r} {why}.",
        hint='Use a name of letters, digits, _ and - (the default is "idempotency_key"), or'
        " None to read keys from the header only.",
        id=INVALID_FORM_FIELD,
    )


def _namespace() -> Iterable[CheckMessage]:
    namespace = conf.NAMESPACE
    limit = IdempotencyRecord._meta.get_field("namespace").max_length
    if limit is not None and len(namespace) > limit:
        yield Error(
            f"IDEMPOTENCY_NAMESPACE = {namespace!r} is {len(namespace)} characters long; the"
            f" limit is {limit}.",
            hint=f"Use a namespace of at most {limit} characters: it is stored in each record.",
            id=NAMESPACE_TOO_LONG,
        )


def _callables() -> Iterable[CheckMessage]:
    for attribute in ("OWNER_RESOLVER", "FINGERPRINT"):
        default = DEFAULT_PATHS[attribute]
        name = f"IDEMPOTENCY_{attribute}"
        hint = f"Set {name} to a callable taking the request, or its dotted path, e.g. {default!r}."
        loaded = _load(name, partial(getattr, conf, attribute), hint)
        if isinstance(loaded, CheckMessage):
            yield loaded
        elif not callable(loaded):
            yield Error(
                f"{name} = {_setting(name)!r} is not callable.",
                hint=hint,
                id=NOT_CALLABLE,
            )


# Settings that are switches: `bool("false")` is True, so a string is refused, not read.
_BOOLEANS = (
    "ENABLED",
    "REQUIRED",
    "STORE_SERVER_ERRORS",
    "METRICS",
    "TRACING",
    "GUARD_ALL_VIEWS",
    "ADMIN",
    "LEASE_RENEWAL",
)


# Names the two packages docs/migration.md covers read; what replaces each one here.
_OTHER_PACKAGES = {
    "IDEMPOTENCY_KEY": "the IDEMPOTENCY_* settings listed in docs/migration.md",
    "IDEMPOTENCY_KEY_HEADER": "IDEMPOTENCY_HEADER",
    "IDEMPOTENCY_KEY_REQUIRED": "IDEMPOTENCY_REQUIRED",
    "IDEMPOTENCY_KEY_METHODS": "IDEMPOTENCY_METHODS",
    "IDEMPOTENCY_KEY_EXPIRATION_MINUTES": "IDEMPOTENCY_TTL",
}


def _booleans() -> Iterable[CheckMessage]:
    for attribute in _BOOLEANS:
        name = f"IDEMPOTENCY_{attribute}"
        yield from _refused(
            attribute,
            f"Set {name} to True or False. From an environment variable, compare the string:"
            f' {name} = os.environ.get("{name}", "true").lower() == "true".',
            NOT_A_BOOLEAN,
        )


def _byte_counts() -> Iterable[CheckMessage]:
    yield from _refused(
        "MAX_STORED_BYTES",
        "For example IDEMPOTENCY_MAX_STORED_BYTES = 1024 * 1024 (the default), or None to store"
        " response bodies of any size.",
        INVALID_BYTE_COUNT,
    )


def _replica_counts() -> Iterable[CheckMessage]:
    yield from _refused(
        "REDIS_WAIT_REPLICAS",
        "For example IDEMPOTENCY_REDIS_WAIT_REPLICAS = 1 (each claim and stored response on at"
        " least one replica before the request goes on), or 0 (the default) not to wait.",
        INVALID_REPLICA_COUNT,
    )


def _encryption_keys() -> Iterable[CheckMessage]:
    yield from _refused(
        "ENCRYPTION_KEYS",
        "For example IDEMPOTENCY_ENCRYPTION_KEYS ="
        ' [os.environ["IDEMPOTENCY_ENCRYPTION_KEY"]], each key made by'
        " cryptography.fernet.Fernet.generate_key(), the newest first; or remove the"
        " setting to store responses in clear.",
        INVALID_ENCRYPTION_KEYS,
    )


def _unknown_names() -> Iterable[CheckMessage]:
    names = (name for name in dir(settings) if name.startswith("IDEMPOTENCY_"))
    for name in sorted(set(names) - SETTING_NAMES):
        if name in _OTHER_PACKAGES:
            yield checks.Warning(
                f"{name} is a setting of another idempotency package; django-idempotency"
                " ignores it.",
                hint=f"Use {_OTHER_PACKAGES[name]} instead (see docs/migration.md), and remove"
                f" {name} once that package is gone.",
                id=UNKNOWN_SETTING,
            )
            continue
        closest = difflib.get_close_matches(name, SETTING_NAMES, n=1, cutoff=0)
        yield checks.Warning(
            f"{name} is not a django-idempotency setting; did you mean {closest[0]}?",
            hint=f"Rename it to {closest[0]} if that is what you meant: as written it is"
            " ignored. A setting of another package that shares the prefix can stay; add this"
            " id to SILENCED_SYSTEM_CHECKS.",
            id=UNKNOWN_SETTING,
        )


_MIDDLEWARE = "django_idempotency.middleware.IdempotencyMiddleware"


def _middleware_order() -> Iterable[CheckMessage]:
    middleware = list(getattr(settings, "MIDDLEWARE", None) or ())
    if _MIDDLEWARE not in middleware:
        return
    skipped = []
    for path in middleware[middleware.index(_MIDDLEWARE) + 1 :]:
        try:
            if hasattr(import_string(path), "process_view"):
                skipped.append(path)
        except ImportError:  # Django reports a middleware that does not import.
            continue
    if skipped:
        yield Error(
            f"{_MIDDLEWARE} is listed before {', '.join(skipped)}: their process_view() would"
            " not run for the views it guards.",
            hint="Move IdempotencyMiddleware to the end of MIDDLEWARE: it calls the view from its"
            " own process_view(), so middleware listed after it (CsrfViewMiddleware's CSRF"
            " check among them) is skipped for guarded requests.",
            id=MIDDLEWARE_NOT_LAST,
        )
