"""The Redis store: one hash per record, claimed and fenced by Lua scripts, expired by Redis TTL."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured

from django_idempotency import threads
from django_idempotency.conf import conf
from django_idempotency.core.keys import key_hash
from django_idempotency.core.outcomes import (
    Claim,
    Outcome,
    Scope,
    StoredResponse,
)
from django_idempotency.stores import redis_wire
from django_idempotency.stores.base import (
    ALL_AT_DEFAULTS,
    BaseStore,
    ClaimRequest,
    PurgeOptions,
    PurgeResult,
    Record,
    StoreUnavailable,
    between_steps,
    fresh_claim,
    new_operation_id,
)
from django_idempotency.stores.clocks import StoreClock

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

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
    "operation",
)

# Writes a new claim from ARGV[1..11] for the operation `operation` (a Lua local: ARGV[12], a
# new identity, unless a take-over resumes the one it found); shared by the claim and the
# take-over, so both write the same record. The key lives for ARGV[11] ms, until the record
# expires and never before its lease ends: a time relative to Redis's own clock, so that it
# holds whatever the application's clock says (naive local time across a clock change, a clock
# that differs).
_WRITE_CLAIM = """
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'namespace', ARGV[1], 'owner', ARGV[2], 'key', ARGV[3],
  'fingerprint', ARGV[4], 'method', ARGV[5], 'path', ARGV[6], 'status', 'in_progress',
  'lease_token', ARGV[7], 'lease_expires_at', ARGV[8], 'created_at', ARGV[9],
  'expires_at', ARGV[10], 'operation', operation)
redis.call('PEXPIRE', KEYS[1], ARGV[11])
"""

# A record read back is answered as one string, each field as its length, ':' and its bytes, or
# '-' when the record has none (`_fields` reads it): one reply to parse, not thirteen, which
# halves a replay's cost on the client.
_PACKED = f"""local function packed(found)
  local out = {{}}
  for i = 1, {len(_READ)} do
    local value = found[i]
    if value then out[i] = #value .. ':' .. value else out[i] = '-' end
  end
  return table.concat(out)
end
"""

# Reads the record (`found`); every script that does answers it `packed`.
_READ_RECORD = (
    _PACKED + f"local found = redis.call('HMGET', KEYS[1], {', '.join(repr(f) for f in _READ)})\n"
)


def _found(field: str) -> str:
    """The Lua expression of a field `_READ_RECORD` read, false when the record has none."""
    return f"found[{_READ.index(field) + 1}]"


# The claim: the record holding the key, or nil once this request has claimed it.
CLAIM = (
    _READ_RECORD
    + f"if {_found('status')} then return packed(found) end\n"
    + "local operation = ARGV[12]\n"
    + _WRITE_CLAIM
    + "return false\n"
)

# The record holding the key as it stands, or nil (`read`).
READ = _READ_RECORD + f"if {_found('status')} then return packed(found) end\nreturn false\n"

# The key whose slot's primary tells the time on a Redis Cluster (nothing is stored under it).
CLOCK_KEY = "django_idempotency:clock"

# A step's result is the hash field STEP_PREFIX + its name.
STEP_PREFIX = "step:"
# What the take-over returns when it resumes the same request's attempt: then the identity of
# the operation it carries on, and the step fields, name and value.
RESUMED = b"resumed"

# The take-over of a record the claim read as abandoned, or the record as it is now if it may
# no longer be taken over: it must still carry the token it was read with (ARGV[13]), so that
# of two retries that read the same stale record exactly one wins, and still be abandoned at
# `now` (ARGV[9]) by `core.outcomes.is_abandoned`'s rule, so that a completion that came in
# between is replayed, not run again. A record gone meanwhile leaves the key free to claim.
# The same request's attempt, still in progress, hands its steps and its operation's identity
# to the new claim, decided here on the record as it is now: any other take-over is a new
# operation (ARGV[12]), even of an attempt read in progress that completed since.
TAKE_OVER = (
    _READ_RECORD
    + f"""local carried, operation, resumed = {{}}, ARGV[12], false
if {_found("status")} then
  local now, abandoned = tonumber(ARGV[9]), false
  if {_found("status")} == 'in_progress' and {_found("lease_expires_at")} then
    abandoned = tonumber({_found("lease_expires_at")}) <= now
  else
    abandoned = tonumber({_found("expires_at")}) <= now
  end
  if {_found("lease_token")} ~= ARGV[13] or not abandoned then return packed(found) end
  if {_found("status")} == 'in_progress' and {_found("fingerprint")} == ARGV[4]
      and {_found("method")} == ARGV[5] and {_found("path")} == ARGV[6] then
    resumed, operation = true, {_found("operation")} or ''
    local fields = redis.call('HGETALL', KEYS[1])
    for i = 1, #fields, 2 do
      if string.sub(fields[i], 1, {len(STEP_PREFIX)}) == '{STEP_PREFIX}' then
        table.insert(carried, fields[i])
        table.insert(carried, fields[i + 1])
      end
    end
  end
end
"""
    + _WRITE_CLAIM
    + f"""if not resumed then return false end
if #carried > 0 then redis.call('HSET', KEYS[1], unpack(carried)) end
table.insert(carried, 1, operation)
table.insert(carried, 1, '{RESUMED.decode()}')
return carried
"""
)

# Completion and release act only while the record carries the claim's token (fencing).
COMPLETE = """
if redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'status', 'completed', 'response_status', ARGV[2],
  'response_reason', ARGV[3], 'response_headers', ARGV[4], 'response_body', ARGV[5],
  'completed_at', ARGV[6])
redis.call('HDEL', KEYS[1], 'lease_expires_at')
redis.call('PEXPIRE', KEYS[1], ARGV[7])
return 1
"""

# A release after the completion (a completion that seemed to fail) leaves the result alone.
RELEASE = """
local held = redis.call('HMGET', KEYS[1], 'lease_token', 'status')
if held[1] ~= ARGV[1] or held[2] ~= 'in_progress' then return 0 end
return redis.call('DEL', KEYS[1])
"""

# A claim that resumed the same request's attempt is given back by ending its lease (at
# ARGV[2]) instead: deleting the record would lose that operation's steps and identity.
END_LEASE = """
local held = redis.call('HMGET', KEYS[1], 'lease_token', 'status')
if held[1] ~= ARGV[1] or held[2] ~= 'in_progress' then return 0 end
redis.call('HSET', KEYS[1], 'lease_expires_at', ARGV[2])
return 1
"""


# A renewal sets the lease's end (ARGV[2]) and keeps the key until then at least (ARGV[3], ms
# from now), so that an in-progress record never expires under a live lease.
RENEW = """
local held = redis.call('HMGET', KEYS[1], 'lease_token', 'status')
if held[1] ~= ARGV[1] or held[2] ~= 'in_progress' then return 0 end
redis.call('HSET', KEYS[1], 'lease_expires_at', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

# Steps only grow: every step saved so far, as fields of the record (ARGV[2..]).
SAVE_STEPS = """
local held = redis.call('HMGET', KEYS[1], 'lease_token', 'status')
if held[1] ~= ARGV[1] or held[2] ~= 'in_progress' then return 0 end
if #ARGV > 1 then redis.call('HSET', KEYS[1], unpack(ARGV, 2)) end
return 1
"""


# Redis's own id of each script (EVALSHA): computed once, not per call.
_SHA1 = {
    source: hashlib.sha1(source.encode()).hexdigest()
    for source in (CLAIM, READ, TAKE_OVER, COMPLETE, RELEASE, END_LEASE, RENEW, SAVE_STEPS)
}


class RedisStore(BaseStore):
    """Records in the Redis behind the django-redis cache alias IDEMPOTENCY_REDIS_CACHE.

    Lease mode only: the claim is a Redis write, outside the view's database transaction. Every
    request costs one script call to claim or replay and one to complete or release.
    """

    supports_atomic = False

    def __init__(self) -> None:
        # Each alias's client and key function, with the CACHES they were made from: Django's
        # cache objects are per thread, and looking one up costs more than a script call's own
        # Python; the client (django-redis's, over its process-wide pool) serves every thread.
        self._clients: dict[str, tuple[Any, Any]] = {}
        self._key_functions: dict[str, tuple[Any, Any]] = {}
        self._policies_checked: set[str] = set()  # The aliases whose eviction policy was read.
        self._clocks: dict[str, StoreClock] = {}  # Each alias's Redis clock.
        self._native = threads.native_local()  # Under gevent, the heartbeat thread's clients.

    @property
    def alias(self) -> str:
        return conf.REDIS_CACHE

    def connection(self) -> Redis | RedisCluster:
        """The alias's client: django-redis's, shared by the process's threads; under gevent,
        in the heartbeat's native thread, a client of that thread's own."""
        if threads.native_under_gevent():
            return self._native_connection()
        return self._client()

    def _client(self) -> Redis | RedisCluster:
        """The alias's client (django-redis's, over its process-wide pool)."""
        return cast("Redis | RedisCluster", self._kept(self._clients, _django_redis_client))

    def _make_key(self, key: str) -> str:
        """`key` as the alias's cache makes its own keys. Its key function is kept apart from the
        client: making the client may already need the server (a Redis Cluster's does)."""
        return str(self._kept(self._key_functions, lambda alias: caches[alias].make_key)(key))

    def _kept(self, kept: dict[str, tuple[Any, Any]], make: Callable[[str], Any]) -> Any:
        """What `make` made for the alias, made again once CACHES changes (as `override_settings`
        changes it: Django then replaces `caches.settings` whole)."""
        alias, configured = self.alias, caches.settings
        made = kept.get(alias)
        if made is None or made[0] is not configured:
            made = kept[alias] = (configured, make(alias))
        return made[1]

    def _native_connection(self) -> Redis | RedisCluster:
        """A client with a pool of the calling native thread's own, made in it. Under gevent
        the sockets of django-redis's pool belong to the greenlets' hub, which a native thread
        must not use, and the pool's locks are greenlets'; sockets opened in the heartbeat's
        thread belong to its own hub, and it renews leases while the greenlets compute."""
        clients = self._native.__dict__.setdefault("clients", {})
        client = clients.get(self.alias)
        if client is None:
            client = clients[self.alias] = _client_of_its_own(self.alias)
        return cast("Redis | RedisCluster", client)

    def now(self) -> datetime:
        """Redis's clock (`TIME`), read once a minute per alias (see `stores.clocks`); on a
        Redis Cluster, the clock of the primary that owns CLOCK_KEY's slot, the same one for
        every server."""
        alias = self.alias
        clock = self._clocks.get(alias)
        if clock is None:
            clock = self._clocks.setdefault(alias, StoreClock(self._read_clock))
        return clock.now()

    def _read_clock(self) -> float:
        from redis.cluster import RedisCluster

        with self._unavailable_as_store_error():
            connection = self.connection()
            if isinstance(connection, RedisCluster):
                owner = connection.get_node_from_key(CLOCK_KEY)  # type: ignore[no-untyped-call]
                seconds, microseconds = connection.get_redis_connection(owner).time()
            else:
                seconds, microseconds = connection.time()
        return float(seconds) + microseconds / 1_000_000

    def record_key(self, scope: Scope) -> str:
        """One key per record, made as the cache alias makes its own keys (its KEY_PREFIX,
        VERSION and KEY_FUNCTION: caches kept apart by them keep their records apart); its hash
        tag puts the whole record in one Cluster slot."""
        digest = hashlib.sha256("\x00".join((scope.namespace, scope.owner, scope.key)).encode())
        return self._make_key(f"django_idempotency:1:{{{digest.hexdigest()}}}")

    def begin(self, request: ClaimRequest) -> Claim:
        key = self.record_key(request.scope)
        token = uuid.uuid4().hex
        # Minted here and sent with the claim: a new record is a new operation.
        operation_id = new_operation_id()
        claim_args = [*_claim_args(request, token), operation_id]
        found = self._claim(CLAIM, key, claim_args, token)
        if found is not None:
            record = _record(found, like=request.now)
            if not record.abandoned(request.now):
                return record.answer(request)
            # Expired, or its request's lease ran out: take it over, unless it changed since.
            between_steps("take-over")
            found = self._claim(TAKE_OVER, key, [*claim_args, record.lease_token], token)
            if _resumed(found):
                steps = {
                    bytes(name).decode().removeprefix(STEP_PREFIX): bytes(value)
                    for name, value in zip(found[2::2], found[3::2], strict=True)
                }
                resumed = bytes(found[1]).decode()
                return fresh_claim(request, token, steps=steps, operation_id=resumed)
            if found is not None:
                record = _record(found, like=request.now)
                if record.abandoned(request.now):
                    return Claim(Outcome.IN_PROGRESS)  # Another retry took it over first.
                return record.answer(request)  # Completed meanwhile (or another retry's).
        return fresh_claim(request, token, operation_id=operation_id)

    def read(self, scope: Scope) -> Record | None:
        found = self._run(READ, self.record_key(scope), [])
        return None if found is None else _record(found, like=self.now())

    def complete(self, claim: Claim, response: StoredResponse, now: datetime) -> bool:
        assert claim.scope is not None and claim.expires_at is not None
        args = [
            claim.lease_token,
            response.status,
            response.reason,
            json.dumps(response.headers),
            response.body,
            _ms(now),
            _ms(claim.expires_at) - _ms(now),  # PEXPIRE: a zero or negative time deletes.
        ]
        key = self.record_key(claim.scope)
        if not conf.REDIS_WAIT_REPLICAS:
            return bool(self._run(COMPLETE, key, args))
        kept, acknowledged = self._run_and_wait(COMPLETE, key, args)
        if kept and acknowledged < conf.REDIS_WAIT_REPLICAS:
            # The view has run and its response is stored on the primary: refusing it now would
            # undo nothing, and the client's retry would be replayed the same response. Send it,
            # and say that a fail-over before the replicas catch up may cost a second run.
            logger.warning(
                "The stored response of key_hash=%s reached %d of the %d replicas"
                " IDEMPOTENCY_REDIS_WAIT_REPLICAS asks for within %s s: it is sent, but a"
                " fail-over of its primary before they catch up loses it, and a retry runs the"
                " view again once the lease ends.",
                key_hash(claim.scope.key),
                acknowledged,
                conf.REDIS_WAIT_REPLICAS,
                _seconds(conf.REDIS_WAIT_TIMEOUT),
            )
        return bool(kept)

    def release(self, claim: Claim) -> bool:
        assert claim.scope is not None
        return bool(self._run(RELEASE, self.record_key(claim.scope), [claim.lease_token]))

    def renew(self, claim: Claim, until: datetime) -> bool:
        assert claim.scope is not None and claim.expires_at is not None
        # To the millisecond below: a lease ended "now" has ended for a retry in the same one.
        end = _ms(until.replace(microsecond=until.microsecond // 1000 * 1000))
        now = _ms(self.now())
        lives = max(_ms(claim.expires_at), end) - now  # As a claim's key lives.
        args = [claim.lease_token, end, max(lives, 1)]
        renewed = bool(self._run(RENEW, self.record_key(claim.scope), args))
        if renewed:
            claim.lease_expires_at = until
        return renewed

    def save_steps(
        self, claim: Claim, steps: Mapping[str, bytes], until: datetime | None = None
    ) -> bool:
        assert claim.scope is not None
        fields = [part for name, value in steps.items() for part in (STEP_PREFIX + name, value)]
        args = [claim.lease_token, *fields]
        saved = bool(self._run(SAVE_STEPS, self.record_key(claim.scope), args))
        # No transaction keeps a Redis record locked, so nothing ever needs `until`: honoured
        # with a renewal of its own, for the contract.
        return saved and (until is None or self.renew(claim, until))

    def purge(self, now: datetime, options: PurgeOptions = ALL_AT_DEFAULTS) -> PurgeResult:
        """Nothing to do, whatever the options: Redis deletes each record when it expires."""
        logger.info("The Redis store's records expire by Redis TTL: the purge deletes nothing.")
        return PurgeResult()

    def _claim(self, source: str, key: str, args: Sequence[Any], token: str) -> Any:
        """Run a script that claims the key (nil once it did); with
        IDEMPOTENCY_REDIS_WAIT_REPLICAS, a claim that too few replicas acknowledged in time is
        given back and the request refused (`StoreUnavailable`): a fail-over could lose it, and a
        retry would then run the view a second time."""
        replicas = conf.REDIS_WAIT_REPLICAS
        if not replicas:
            return self._run(source, key, args)
        found, acknowledged = self._run_and_wait(source, key, args)
        if (found is None or _resumed(found)) and acknowledged < replicas:
            if found is None:
                self._run(RELEASE, key, [token])
            else:  # Ended when it was claimed: the retry resumes it again.
                self._run(END_LEASE, key, [token, args[_CLAIMED_AT]])
            raise StoreUnavailable(
                f"Redis ({self.alias!r}): the claim reached {acknowledged} of the {replicas}"
                " replicas IDEMPOTENCY_REDIS_WAIT_REPLICAS asks for within"
                f" {_seconds(conf.REDIS_WAIT_TIMEOUT)} s; the request is refused rather than"
                " run unprotected. Check the replicas' links (INFO replication)."
            )
        return found

    def _run(self, source: str, key: str, args: Sequence[Any]) -> Any:
        """Run a script on the record's key; a Redis that cannot answer is `StoreUnavailable`."""
        from redis.exceptions import NoScriptError, RedisClusterException, RedisError

        sha = _SHA1[source]
        # Not `_unavailable_as_store_error`: every request runs this twice, and a generator's
        # context manager costs more than the try.
        try:
            connection = self._checked_connection()
            try:
                found = redis_wire.call(connection, sha, key, args)
                if found is redis_wire.SLOW:
                    found = connection.evalsha(sha, 1, key, *args)
                return found
            except NoScriptError:  # A new Redis, or one restarted: it has no script yet.
                connection.script_load(source)
                return connection.evalsha(sha, 1, key, *args)
        except (RedisError, RedisClusterException) as exc:
            raise self._unavailable(exc) from exc

    def _run_and_wait(self, source: str, key: str, args: Sequence[Any]) -> tuple[Any, int]:
        """Run a script, then WAIT for IDEMPOTENCY_REDIS_WAIT_REPLICAS replicas: the script's
        answer, and how many replicas acknowledged its write in time.

        WAIT counts the writes of the connection it is sent on, so both go in one pipeline, to
        the node that owns the key (on a Redis Cluster, the primary of the key's slot): one
        round trip, one connection. On a cluster whose slots moved (a fail-over) or a node that
        is gone, the slots are read again and the pipeline sent once more; every script may run
        twice (a claim finds its own record, a completion writes the same fields).
        """
        from redis.cluster import RedisCluster
        from redis.exceptions import ConnectionError, MovedError, NoScriptError

        timeout = max(1, math.ceil(conf.REDIS_WAIT_TIMEOUT.total_seconds() * 1000))
        sha = _SHA1[source]
        with self._unavailable_as_store_error():
            connection = self._checked_connection()
            for attempt in range(3):
                node = connection
                if isinstance(connection, RedisCluster):
                    owner = connection.get_node_from_key(key)  # type: ignore[no-untyped-call]
                    node = connection.get_redis_connection(owner)
                try:
                    pipeline = node.pipeline(transaction=False)
                    pipeline.evalsha(sha, 1, key, *args)
                    pipeline.execute_command("WAIT", conf.REDIS_WAIT_REPLICAS, timeout)
                    found, acknowledged = pipeline.execute(raise_on_error=False)
                    if isinstance(found, NoScriptError) and attempt == 0:
                        node.script_load(source)  # A new node (or a restarted one) has none.
                        continue
                    if isinstance(found, Exception):
                        raise found
                    if isinstance(acknowledged, Exception):
                        raise acknowledged
                    return found, int(acknowledged)
                except (ConnectionError, MovedError):
                    if not isinstance(connection, RedisCluster) or attempt == 2:
                        raise
                    connection.nodes_manager.initialize()  # Where the slot's primary is now.
        raise AssertionError("unreachable")  # pragma: no cover

    @contextlib.contextmanager
    def _unavailable_as_store_error(self) -> Iterator[None]:
        """A Redis (or Redis Cluster) that cannot answer is `StoreUnavailable`."""
        from redis.exceptions import RedisClusterException, RedisError

        try:
            yield
        except (RedisError, RedisClusterException) as exc:
            raise self._unavailable(exc) from exc

    def _unavailable(self, exc: Exception) -> StoreUnavailable:
        return StoreUnavailable(f"Redis ({self.alias!r}): {exc}")

    def _checked_connection(self) -> Redis | RedisCluster:
        connection = self.connection()
        if self.alias not in self._policies_checked:
            self._check_eviction_policy(connection)
        return connection

    def _check_eviction_policy(self, connection: Redis | RedisCluster) -> None:
        """Warn, once per alias, of a Redis that may evict a live claim: with any policy but
        noeviction it drops keys that have an expiry (every record has one) when memory is full,
        and a retry whose claim was evicted runs the view again. On a Redis Cluster, of each
        primary."""
        from redis.cluster import RedisCluster
        from redis.exceptions import ResponseError

        try:
            if isinstance(connection, RedisCluster):
                answers = connection.config_get(
                    "maxmemory-policy", target_nodes=RedisCluster.PRIMARIES
                )
                # One answer per primary, by node name; a cluster of one primary answers alone.
                several = "maxmemory-policy" not in answers
                answer = _strictest(list(answers.values()) if several else [answers])
            else:
                answer = connection.config_get("maxmemory-policy")
        except ResponseError as exc:  # CONFIG renamed away or not allowed (managed Redis).
            logger.debug(
                "Could not read the maxmemory-policy of the Redis of IDEMPOTENCY_REDIS_CACHE ="
                " %r (make sure it is noeviction): %s",
                self.alias,
                exc,
            )
        else:
            # A dict of str on every client django-redis builds; anything else is not judged.
            policy = answer.get("maxmemory-policy") if isinstance(answer, dict) else None
            if policy is not None and policy != "noeviction":
                logger.warning(
                    "The Redis of IDEMPOTENCY_REDIS_CACHE = %r evicts keys when its memory is"
                    " full (maxmemory-policy %s): a claim it evicts lets a retry run the view"
                    " again. Set maxmemory-policy noeviction on that Redis.",
                    self.alias,
                    policy,
                )
        self._policies_checked.add(self.alias)


def _client_of_its_own(alias: str) -> Any:
    """A client of the django-redis alias as django-redis makes it (the alias's factory, URL,
    options and client class), but with a connection pool of its own, not the process's."""
    client: Any = getattr(caches[alias], "client", None)
    if not hasattr(client, "connection_factory"):
        raise NotImplementedError  # Not django-redis's: the caller says so.
    afresh = getattr(client, "connect_afresh", None)  # RedisClusterClient's.
    if afresh is not None:
        return afresh()
    factory = client.connection_factory
    params = factory.make_connection_params(client._server[0])  # The primary, as write=True.
    pool = factory.get_connection_pool(params)  # Not get_or_create: the shared one.
    return factory.redis_client_cls(connection_pool=pool, **factory.redis_client_cls_kwargs)


def _resumed(found: Any) -> bool:
    """Whether a take-over's answer is the claim it made resuming the same request's attempt,
    with that operation's identity and the steps it carried over."""
    return isinstance(found, list) and bool(found) and found[0] == RESUMED


def _strictest(answers: list[Any]) -> Any:
    """Of the primaries' CONFIG GET answers, one that evicts if any does."""
    for answer in answers:
        if isinstance(answer, dict) and answer.get("maxmemory-policy") != "noeviction":
            return answer
    return answers[0] if answers else None


def _seconds(duration: timedelta) -> str:
    return f"{duration.total_seconds():g}"


def _fields(packed: bytes) -> list[bytes | None]:
    """The fields of a record as `_PACKED` answers them, in `_READ`'s order."""
    fields: list[bytes | None] = []
    at = 0
    for _ in _READ:
        if packed[at : at + 1] == b"-":
            fields.append(None)
            at += 1
            continue
        colon = packed.index(b":", at)
        end = colon + 1 + int(packed[at:colon])
        fields.append(packed[colon + 1 : end])
        at = end
    return fields


def _record(found: bytes, *, like: datetime) -> Record:
    """A record a script read back (`_PACKED`); its times of the same kind as `like`."""
    fields = dict(zip(_READ, _fields(found), strict=True))
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
        operation_id=_text(fields["operation"]),
    )


def _django_redis_client(alias: str) -> Any:
    """django-redis's client of the cache `alias`: a RedisCluster with
    django_idempotency.contrib.redis_cluster.RedisClusterClient."""
    # django-redis ships no type information.
    from django_redis import get_redis_connection  # type: ignore[import-untyped]

    try:
        return get_redis_connection(alias, write=True)
    except NotImplementedError as exc:
        raise ImproperlyConfigured(
            f"IDEMPOTENCY_REDIS_CACHE = {alias!r} is not a django-redis cache: the"
            " Redis store needs its connection (BACKEND django_redis.cache.RedisCache)."
        ) from exc


_CLAIMED_AT = 8  # The index of the claim's `now` in `_claim_args`.


def _claim_args(request: ClaimRequest, token: str) -> list[Any]:
    scope = request.scope
    now = _ms(request.now)
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
        now,
        expires,
        max(expires, lease_end) - now,  # PEXPIRE: how long the key must live from now.
    ]


def _ms(moment: datetime) -> int:
    """Milliseconds since the epoch; `now` and the times computed from it (`now + ttl`,
    `now + lease`) keep their order.

    A naive datetime is local time (USE_TZ = False) and is read as its first occurrence: in
    the hour a clock change repeats, `now` (fold=1, the second occurrence) and `now + ttl`
    (fold=0, as datetime arithmetic leaves it) would otherwise be an hour apart the wrong way.
    """
    if moment.tzinfo is None:
        moment = moment.replace(fold=0)
    return round(moment.timestamp() * 1000)


def _datetime(value: bytes | None, like: datetime) -> datetime | None:
    """A stored time as a datetime of the same kind (aware or naive) as `like`."""
    if value is None:
        return None
    return datetime.fromtimestamp(int(value) / 1000, tz=like.tzinfo)


def _text(value: bytes | None) -> str:
    return "" if value is None else value.decode()
