"""The Redis store: one hash per record, claimed and fenced by Lua scripts, expired by Redis TTL."""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured

from django_idempotency.conf import conf
from django_idempotency.core.outcomes import (
    Claim,
    Outcome,
    Scope,
    StoredResponse,
)
from django_idempotency.stores.base import (
    ALL_AT_DEFAULTS,
    BaseStore,
    ClaimRequest,
    PurgeOptions,
    PurgeResult,
    Record,
    StoreUnavailable,
    fresh_claim,
)

if TYPE_CHECKING:
    from redis import Redis
    from redis.commands.core import Script

logger = logging.getLogger("django_idempotency")

# The fields a claim reads back from a record that already holds the key, in this order.
_READ = (
    "status",
    "fingerprint",
    "method",
    "path",
    "lease_token",
    "lease_expires_at",
    "created_at",
    "expires_at",
    "response_status",
    "response_reason",
    "response_headers",
    "response_body",
)

# Writes a new claim from ARGV[1..11]; shared by the claim and the take-over, so both write
# the same record. The key lives until the record expires, and never before its lease ends.
_WRITE_CLAIM = """
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'namespace', ARGV[1], 'owner', ARGV[2], 'key', ARGV[3],
  'fingerprint', ARGV[4], 'method', ARGV[5], 'path', ARGV[6], 'status', 'in_progress',
  'lease_token', ARGV[7], 'lease_expires_at', ARGV[8], 'created_at', ARGV[9],
  'expires_at', ARGV[10])
redis.call('PEXPIREAT', KEYS[1], ARGV[11])
"""

# The claim: the record holding the key, or nil once this request has claimed it.
CLAIM = (
    f"local found = redis.call('HMGET', KEYS[1], {', '.join(repr(f) for f in _READ)})\n"
    "if found[1] then return found end\n" + _WRITE_CLAIM + "return false\n"
)

# An abandoned record taken over, only if it still carries the token it was read with
# (ARGV[12]): of two retries that read the same stale record, exactly one wins.
TAKE_OVER = (
    "if redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[12] then return 0 end\n"
    + _WRITE_CLAIM
    + "return 1\n"
)

# Completion and release act only while the record carries the claim's token (fencing).
COMPLETE = """
if redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'status', 'completed', 'response_status', ARGV[2],
  'response_reason', ARGV[3], 'response_headers', ARGV[4], 'response_body', ARGV[5],
  'completed_at', ARGV[6])
redis.call('HDEL', KEYS[1], 'lease_expires_at')
redis.call('PEXPIREAT', KEYS[1], ARGV[7])
return 1
"""

RELEASE = """
if redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
"""


class RedisStore(BaseStore):
    """Records in the Redis behind the django-redis cache alias IDEMPOTENCY_REDIS_CACHE.

    Lease mode only: the claim is a Redis write, outside the view's database transaction. Every
    request costs one script call to claim or replay and one to complete or release.
    """

    supports_atomic = False

    def __init__(self) -> None:
        self._scripts: dict[str, Script] = {}

    @property
    def alias(self) -> str:
        return conf.REDIS_CACHE

    def connection(self) -> Redis:
        # django-redis ships no type information.
        from django_redis import get_redis_connection  # type: ignore[import-untyped]

        try:
            return cast("Redis", get_redis_connection(self.alias, write=True))
        except NotImplementedError as exc:
            raise ImproperlyConfigured(
                f"IDEMPOTENCY_REDIS_CACHE = {self.alias!r} is not a django-redis cache: the"
                " Redis store needs its connection (BACKEND django_redis.cache.RedisCache)."
            ) from exc

    def record_key(self, scope: Scope) -> str:
        """One key per record; its hash tag puts the whole record in one Cluster slot."""
        digest = hashlib.sha256("\x00".join((scope.namespace, scope.owner, scope.key)).encode())
        prefix = caches[self.alias].key_prefix
        return f"{prefix}{':' if prefix else ''}django_idempotency:1:{{{digest.hexdigest()}}}"

    def begin(self, request: ClaimRequest) -> Claim:
        key = self.record_key(request.scope)
        token = uuid.uuid4().hex
        claim_args = _claim_args(request, token)
        found = self._run(CLAIM, key, claim_args)
        if found is not None:
            record = _record(found, like=request.now)
            if not record.abandoned(request.now):
                return record.answer(request)
            # Expired, or its request's lease ran out: take it over unless another retry did.
            if not self._run(TAKE_OVER, key, [*claim_args, record.lease_token]):
                return Claim(Outcome.IN_PROGRESS)
        return fresh_claim(request, token)

    def complete(self, claim: Claim, response: StoredResponse, now: datetime) -> bool:
        assert claim.scope is not None and claim.expires_at is not None
        args = [
            claim.lease_token,
            response.status,
            response.reason,
            json.dumps(response.headers),
            response.body,
            _ms(now),
            _ms(claim.expires_at),
        ]
        return bool(self._run(COMPLETE, self.record_key(claim.scope), args))

    def release(self, claim: Claim) -> bool:
        assert claim.scope is not None
        return bool(self._run(RELEASE, self.record_key(claim.scope), [claim.lease_token]))

    def purge(self, now: datetime, options: PurgeOptions = ALL_AT_DEFAULTS) -> PurgeResult:
        """Nothing to do, whatever the options: Redis deletes each record when it expires."""
        logger.info("The Redis store's records expire by Redis TTL: the purge deletes nothing.")
        return PurgeResult()

    def _run(self, source: str, key: str, args: Sequence[Any]) -> Any:
        """Run a script on the record's key; a Redis that cannot answer is `StoreUnavailable`."""
        from redis.exceptions import RedisError

        try:
            connection = self.connection()
            script = self._scripts.get(source)
            if script is None:
                script = self._scripts[source] = connection.register_script(source)
            return script(keys=[key], args=args, client=connection)
        except RedisError as exc:
            raise StoreUnavailable(f"Redis ({self.alias!r}): {exc}") from exc


def _record(found: list[bytes | None], *, like: datetime) -> Record:
    """A record the claim script read back; its times of the same kind as `like`."""
    fields = dict(zip(_READ, found, strict=True))
    expires_at = _datetime(fields["expires_at"], like)
    assert expires_at is not None
    response = None
    if fields["response_status"] is not None:
        headers = json.loads(fields["response_headers"] or b"[]")
        response = StoredResponse(
            status=int(fields["response_status"]),
            headers=[(str(name), str(value)) for name, value in headers],
            body=fields["response_body"] or b"",
            reason=_text(fields["response_reason"]),
        )
    return Record(
        fingerprint=_text(fields["fingerprint"]),
        method=_text(fields["method"]),
        path=_text(fields["path"]),
        status=_text(fields["status"]),
        lease_token=_text(fields["lease_token"]),
        lease_expires_at=_datetime(fields["lease_expires_at"], like),
        created_at=_datetime(fields["created_at"], like) or expires_at,
        expires_at=expires_at,
        response=response,
    )


def _claim_args(request: ClaimRequest, token: str) -> list[Any]:
    scope = request.scope
    expires = _ms(request.expires_at)
    lease_end = _ms(request.lease_expires_at or request.expires_at)
    return [
        scope.namespace,
        scope.owner,
        scope.key,
        request.fingerprint,
        request.method,
        request.path,
        token,
        lease_end,
        _ms(request.now),
        expires,
        max(expires, lease_end),
    ]


def _ms(moment: datetime) -> int:
    """Milliseconds since the epoch (a naive datetime is local time, as with USE_TZ = False)."""
    return round(moment.timestamp() * 1000)


def _datetime(value: bytes | None, like: datetime) -> datetime | None:
    """A stored time as a datetime of the same kind (aware or naive) as `like`."""
    if value is None:
        return None
    return datetime.fromtimestamp(int(value) / 1000, tz=like.tzinfo)


def _text(value: bytes | None) -> str:
    return "" if value is None else value.decode()
