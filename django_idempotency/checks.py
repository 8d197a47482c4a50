"""System checks that report IDEMPOTENCY_* misconfiguration before the first request."""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core import checks
from django.core.cache.backends.dummy import DummyCache
from django.core.cache.backends.locmem import LocMemCache
from django.core.checks import CheckMessage, Error
from django.core.exceptions import ImproperlyConfigured
from django.db.utils import load_backend
from django.urls import URLResolver, get_resolver
from django.utils.module_loading import import_string

from django_idempotency.conf import (
    DEFAULT_PATHS,
    ERROR_FORMATS,
    HEADER_NAME,
    MODES,
    ON_CONFLICT,
    SETTING_NAMES,
    conf,
    load_callable,
)
from django_idempotency.contrib.rest_framework.mixins import IdempotencyMixin
from django_idempotency.core.keys import KEY_FORMATS
from django_idempotency.http.options import attribute_errors
from django_idempotency.models import IdempotencyRecord
from django_idempotency.schema import missing_table, missing_table_message, records_database
from django_idempotency.stores.base import BaseStore
from django_idempotency.stores.database import DatabaseStore, records_alias
from django_idempotency.stores.memory import MemoryStore
from django_idempotency.stores.redis import RedisStore

if TYPE_CHECKING:
    from django.apps import AppConfig

# Ids are part of the public contract (users silence them by id): never renumber one, and never
# give a retired id to another mistake. Each is documented in docs/checks.md.
INVALID_DURATION = "django_idempotency.E001"
DURATION_OUT_OF_RANGE = "django_idempotency.E002"
INVALID_CHOICE = "django_idempotency.E003"
INVALID_COLLECTION = "django_idempotency.E004"
INVALID_HEADER = "django_idempotency.E005"
NAMESPACE_TOO_LONG = "django_idempotency.E006"
UNRESOLVABLE_PATH = "django_idempotency.E007"
NOT_CALLABLE = "django_idempotency.E008"
NOT_A_STORE = "django_idempotency.E009"
UNKNOWN_CACHE = "django_idempotency.E010"
UNKNOWN_DATABASE = "django_idempotency.E011"
UNSUPPORTED_DATABASE = "django_idempotency.E012"
UNSHARED_CACHE = "django_idempotency.W001"
SQLITE_IN_DEPLOYMENT = "django_idempotency.W002"
DISABLED_IN_DEPLOYMENT = "django_idempotency.W003"
TTL_SHORTER_THAN_LEASE = "django_idempotency.W004"
MIXIN_AFTER_API_VIEW = "django_idempotency.E013"
INVALID_VIEW_ATTRIBUTE = "django_idempotency.E014"
NOT_A_BOOLEAN = "django_idempotency.E015"
INVALID_BYTE_COUNT = "django_idempotency.E016"
UNKNOWN_SETTING = "django_idempotency.W005"
TABLE_MISSING = "django_idempotency.W006"
MIDDLEWARE_NOT_LAST = "django_idempotency.E017"
ATOMIC_ON_LEASE_ONLY_STORE = "django_idempotency.E018"
UNUSABLE_REDIS_CACHE = "django_idempotency.E019"
MEMORY_STORE_IN_DEPLOYMENT = "django_idempotency.E020"

TAG = "django_idempotency"

_UNSET = object()

_DEFAULT_STORE = DEFAULT_PATHS["STORE"]


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
        *_namespace(),
        *_callables(),
        *_store(),
        *_cache(),
        *_database(),
        *_booleans(),
        *_byte_counts(),
        *_unknown_names(),
        *_middleware_order(),
        *_atomic_setting_on_lease_only_store(),
        *_redis_cache(),
    ]


def check_deployment(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """What is fine on a laptop but wrong under a production server (`check --deploy`)."""
    messages: list[CheckMessage] = []
    if _setting("IDEMPOTENCY_ENABLED") is False:
        messages.append(
            checks.Warning(
                f"IDEMPOTENCY_ENABLED = {_setting('IDEMPOTENCY_ENABLED')!r}: idempotency is"
                " switched off, so retried requests run their view again and no key is checked"
                " or required.",
                hint="Remove IDEMPOTENCY_ENABLED (or set it to True) once the emergency is over;"
                " it is meant for test suites and incidents, not for production.",
                id=DISABLED_IN_DEPLOYMENT,
            )
        )
    store_class = _store_class()
    if isinstance(store_class, type) and issubclass(store_class, MemoryStore):
        messages.append(
            Error(
                f"IDEMPOTENCY_STORE = {conf.STORE!r} keeps records in each process's memory.",
                hint="Other worker processes never see its claims, so a retry that reaches"
                " another process runs the view again, and a restart forgets every record. Use"
                " the database store (the default) or"
                " django_idempotency.stores.redis.RedisStore in production.",
                id=MEMORY_STORE_IN_DEPLOYMENT,
            )
        )
    database = _store_database()
    if database is not None and database[1] == "sqlite":
        alias = database[0]
        messages.append(
            checks.Warning(
                f"The idempotency store's database {alias!r} is SQLite"
                f" ({_database_source(alias)}).",
                hint="SQLite lets one connection write at a time: under a server with several"
                " worker processes, claims queue for its write lock, and a claim that cannot get"
                " it within the database timeout is answered 409 Conflict as if its key were in"
                " use. Use PostgreSQL in production (point IDEMPOTENCY_DATABASE at it), or"
                " add this id to SILENCED_SYSTEM_CHECKS if a single process serves the site.",
                id=SQLITE_IN_DEPLOYMENT,
            )
        )
    return messages


def _setting(name: str) -> Any:
    """The raw value, or `_UNSET`: defaults are valid, so only explicit values need checking."""
    return getattr(settings, name, _UNSET)


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


def _seconds(value: timedelta) -> str:
    seconds = value.total_seconds()
    return f"{seconds:g} second" + ("" if seconds == 1 else "s")


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
    ignored = _setting("IDEMPOTENCY_FINGERPRINT_IGNORE_FIELDS")
    if ignored is not _UNSET and not _strings(ignored, bare_string_allowed=False):
        yield Error(
            f"IDEMPOTENCY_FINGERPRINT_IGNORE_FIELDS = {ignored!r} is not a collection of field"
            " names.",
            hint='Use a list or tuple, e.g. IDEMPOTENCY_FINGERPRINT_IGNORE_FIELDS = ["nonce"]:'
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


def _load(name: str, load: Callable[[], Any], hint: str) -> Any:
    """What `load` returns, or the Error that says why it cannot be imported."""
    try:
        return load()
    except Exception as exc:  # Also a module that fails while importing: an Error, no traceback.
        ours = isinstance(exc, ImproperlyConfigured) and str(exc).startswith(name)
        message = str(exc) if ours else f"{name} = {_setting(name)!r} cannot be imported: {exc!r}"
    return Error(message, hint=hint, id=UNRESOLVABLE_PATH)


def _store_class() -> Any:
    """The IDEMPOTENCY_STORE class as `get_store` loads it, or the Error saying why it cannot."""
    return _load(
        "IDEMPOTENCY_STORE",
        partial(load_callable, conf.STORE, "IDEMPOTENCY_STORE"),
        "Set IDEMPOTENCY_STORE to the dotted path (a string, not the class) of a BaseStore"
        f" subclass, e.g. {_DEFAULT_STORE!r}.",
    )


def _store() -> Iterable[CheckMessage]:
    store_class = _store_class()
    if isinstance(store_class, CheckMessage):
        yield store_class
    elif not (isinstance(store_class, type) and issubclass(store_class, BaseStore)):
        yield Error(
            f"IDEMPOTENCY_STORE = {conf.STORE!r} is not a BaseStore subclass.",
            hint="Point IDEMPOTENCY_STORE at a subclass of django_idempotency.stores.BaseStore"
            f" that implements its contract, or remove it to use {_DEFAULT_STORE!r}.",
            id=NOT_A_STORE,
        )


def _cache() -> Iterable[CheckMessage]:
    alias = conf.CACHE
    if alias is None:
        return
    caches = settings.CACHES
    if alias not in caches:
        yield Error(
            f"IDEMPOTENCY_CACHE = {alias!r} is not an alias in CACHES"
            f" ({', '.join(map(repr, caches)) or 'none defined'}).",
            hint=f"Define the alias {alias!r} in CACHES (a shared cache such as Redis), or set"
            " IDEMPOTENCY_CACHE to an existing alias, or to None to turn the cache tier off.",
            id=UNKNOWN_CACHE,
        )
        return
    try:
        backend_path = str(caches[alias]["BACKEND"])
        backend = import_string(backend_path)
    except Exception:  # Django reports a broken cache when it is used; the tier uses the store.
        return
    if isinstance(backend, type) and issubclass(backend, DummyCache):
        why = "DummyCache stores nothing, so the tier never serves a replay and only adds a call"
    elif isinstance(backend, type) and issubclass(backend, LocMemCache):
        why = (
            "LocMemCache lives in one process's memory: a replay cached there is not seen by the"
            " other processes, and it keeps replaying a record after another process deletes it"
            " (from the admin, for example)"
        )
    else:
        return
    yield checks.Warning(
        f"IDEMPOTENCY_CACHE = {alias!r} uses {backend_path}, which cannot share replays"
        " between processes.",
        hint=f"{why}. Point IDEMPOTENCY_CACHE at a cache every process shares (Redis,"
        " Memcached), or set it to None.",
        id=UNSHARED_CACHE,
    )


def _database() -> Iterable[CheckMessage]:
    alias = conf.DATABASE
    if alias and alias not in settings.DATABASES:  # "" means unset, as it does for the store.
        yield Error(
            f"IDEMPOTENCY_DATABASE = {alias!r} is not an alias in DATABASES"
            f" ({', '.join(map(repr, settings.DATABASES))}).",
            hint="Set IDEMPOTENCY_DATABASE to an alias defined in DATABASES, or to None to use"
            " the database the routers choose for IdempotencyRecord.",
            id=UNKNOWN_DATABASE,
        )
        return
    database = _store_database()
    if database is not None and database[1] not in ("postgresql", "mysql", "sqlite"):
        store_alias, vendor, engine = database
        yield Error(
            f"The idempotency store's database {store_alias!r} ({_database_source(store_alias)})"
            " uses"
            f" {engine} ({vendor}); the database store supports PostgreSQL, MariaDB and SQLite.",
            hint="Point IDEMPOTENCY_DATABASE at a PostgreSQL or MariaDB database in DATABASES,"
            " or set IDEMPOTENCY_STORE to a store written for this database.",
            id=UNSUPPORTED_DATABASE,
        )


def _store_database() -> tuple[str, str, str] | None:
    """(alias, vendor, ENGINE) of the database store's database; None if another store is used.

    The vendor comes from the backend class, so no connection is opened; anything that cannot be
    determined is left to the checks (and errors) that own it.
    """
    store_class = _store_class()
    if not (isinstance(store_class, type) and issubclass(store_class, DatabaseStore)):
        return None
    try:
        alias = records_alias()
        engine = settings.DATABASES[alias].get("ENGINE") or "django.db.backends.dummy"
    except Exception:  # An unknown alias, a router that fails.
        return None
    try:
        vendor = load_backend(engine).DatabaseWrapper.vendor
    except Exception:  # Its driver is not installed here (cx_Oracle, mssql): name it by its path.
        vendor = engine.rsplit(".", 1)[-1]
    return alias, vendor, engine


def _database_source(alias: str) -> str:
    if conf.DATABASE:
        return f"IDEMPOTENCY_DATABASE = {alias!r}"
    return "IDEMPOTENCY_DATABASE is unset, so it is the database the routers choose"


# Settings that are switches: `bool("false")` is True, so a string is refused, not read.
_BOOLEANS = ("ENABLED", "REQUIRED", "STORE_SERVER_ERRORS", "METRICS", "GUARD_ALL_VIEWS", "ADMIN")

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


def check_views(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Routed view classes whose idempotency would fail silently, or on their first request."""
    messages: list[CheckMessage] = list(_atomic_views_on_lease_only_store())
    for route, view_class in _routed_view_classes():
        label = f"{view_class.__module__}.{view_class.__qualname__}"
        if _mixin_shadowed(view_class):
            bases = ", ".join(
                base.__name__ for base in view_class.__bases__ if base is not IdempotencyMixin
            )
            messages.append(
                Error(
                    f"{label} (routed at {route!r}) lists IdempotencyMixin after DRF's APIView"
                    " in its MRO: APIView's methods run instead of the mixin's, so no request"
                    " to it is guarded.",
                    hint=f"Put the mixin first: class {view_class.__name__}(IdempotencyMixin,"
                    f" {bases}).",
                    id=MIXIN_AFTER_API_VIEW,
                )
            )
        messages.extend(
            Error(
                f"{label}.{attribute} = {value!r} (routed at {route!r}): {why}",
                hint="Give it a value the matching option of @idempotent accepts (see"
                " docs/drf.md), or remove it to use the IDEMPOTENCY_* setting.",
                id=INVALID_VIEW_ATTRIBUTE,
            )
            for attribute, value, why in attribute_errors(view_class)
        )
    return messages


def _routed_view_classes() -> Iterator[tuple[str, type]]:
    """Each view class the URLconf routes to (DRF's `cls`, Django's `view_class`), once."""
    try:
        patterns = get_resolver().url_patterns
    except Exception:  # Django's own URL checks report a URLconf that does not load.
        return
    seen: set[type] = set()
    for route, callback in _routes(patterns, ""):
        view_class = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
        if isinstance(view_class, type) and view_class not in seen:
            seen.add(view_class)
            yield route, view_class


def _routes(patterns: Iterable[Any], prefix: str) -> Iterator[tuple[str, Any]]:
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            try:
                yield from _routes(pattern.url_patterns, route)
            except Exception:  # An include that fails to load: Django reports it.
                continue
        else:
            yield route, pattern.callback


def _mixin_shadowed(view_class: type) -> bool:
    # DRF is never imported here: a routed DRF view has imported it already.
    api_view = getattr(sys.modules.get("rest_framework.views"), "APIView", None)
    mro = view_class.__mro__
    return (
        api_view in mro
        and IdempotencyMixin in mro
        and mro.index(IdempotencyMixin) > mro.index(api_view)
    )


def check_database(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Collection[str] | None = None,
    **kwargs: Any,
) -> list[CheckMessage]:
    """`check --database <alias>`: the records table exists where the store looks for it."""
    alias = records_database()
    if not databases or alias is None or alias not in databases or not missing_table(alias):
        return []
    # A warning: `migrate` runs this check too, before it creates the table.
    return [
        checks.Warning(
            missing_table_message(alias),
            hint="Until it exists every guarded request is refused with 503 store-unavailable.",
            id=TABLE_MISSING,
        )
    ]


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


def _lease_only_store() -> str | None:
    """The configured store's dotted path if it cannot run atomic mode, else None."""
    store_class = _store_class()
    if not (isinstance(store_class, type) and issubclass(store_class, BaseStore)):
        return None  # E007 or E009 says why.
    # A property (a wrapper deciding per instance) cannot be read from the class: not reported.
    supports_atomic = store_class.supports_atomic
    return conf.STORE if supports_atomic is False else None


def _atomic_on_lease_only_store(what: str, store: str) -> Error:
    return Error(
        f"{what} asks for atomic mode, but IDEMPOTENCY_STORE = {store!r} has lease mode only:"
        " its claims are not part of the view's database transaction, so the view's writes"
        " would not roll back with them.",
        hint='Use mode "lease" (IDEMPOTENCY_MODE = "lease", or remove the setting: such a store'
        " runs every view leased), or use the database store for views that need atomic mode.",
        id=ATOMIC_ON_LEASE_ONLY_STORE,
    )


def _atomic_setting_on_lease_only_store() -> Iterable[CheckMessage]:
    store = _lease_only_store()
    if store is not None and _setting("IDEMPOTENCY_MODE") == "atomic":
        yield _atomic_on_lease_only_store('IDEMPOTENCY_MODE = "atomic"', store)


def _atomic_views_on_lease_only_store() -> Iterator[CheckMessage]:
    """Routed views whose attribute or @idempotent(mode=...) asks for atomic mode."""
    store = _lease_only_store()
    if store is None:
        return
    try:
        routes = list(_routes(get_resolver().url_patterns, ""))
    except Exception:  # Django's own URL checks report a URLconf that does not load.
        return
    seen: set[int] = set()
    for route, callback in routes:
        view_class = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
        holders = [callback] if view_class is None else [view_class, *vars(view_class).values()]
        for holder in holders:
            options = getattr(holder, "idempotency_options", None)
            mode = getattr(options, "mode", None) or getattr(holder, "idempotency_mode", None)
            if mode == "atomic" and id(holder) not in seen:
                seen.add(id(holder))
                name = getattr(holder, "__qualname__", repr(holder))
                label = f"{getattr(holder, '__module__', '')}.{name} (routed at {route!r})"
                yield _atomic_on_lease_only_store(label, store)


def _redis_cache() -> Iterable[CheckMessage]:
    store_class = _store_class()
    if not (isinstance(store_class, type) and issubclass(store_class, RedisStore)):
        return
    alias = conf.REDIS_CACHE
    backend = settings.CACHES.get(alias, {}).get("BACKEND", "")
    try:
        usable = issubclass(import_string(backend), import_string(_DJANGO_REDIS))
    except ImportError:  # An alias that is missing, or django-redis not installed.
        usable = False
    if not usable:
        where = f"uses {backend}" if backend else "is not an alias in CACHES"
        yield Error(
            f"IDEMPOTENCY_REDIS_CACHE = {alias!r} {where}: the Redis store needs a django-redis"
            " cache for its connection.",
            hint=f"Define CACHES[{alias!r}] with BACKEND {_DJANGO_REDIS!r} (pip install"
            " django-idempotency[redis]), or point IDEMPOTENCY_REDIS_CACHE at such an alias.",
            id=UNUSABLE_REDIS_CACHE,
        )


_DJANGO_REDIS = "django_redis.cache.RedisCache"
