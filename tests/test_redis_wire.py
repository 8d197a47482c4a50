"""Script calls sent packed on a pooled connection: redis-py's bytes, answers and errors."""

from __future__ import annotations

import contextlib
import enum
import gc
import socket
import threading
import weakref
from collections.abc import Iterator
from http import HTTPStatus
from typing import Any

import pytest
import redis
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path
from django.utils.safestring import mark_safe
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_idempotency import idempotent
from django_idempotency.core.outcomes import Scope, StoredResponse
from django_idempotency.http.responses import REPLAYED_HEADER
from django_idempotency.stores.redis import _PACKED, RedisStore, _fields
from django_idempotency.stores.redis_wire import SLOW, call, pack
from tests.stores import REDIS_URL
from tests.utils import post

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]

NO_RETRY = Retry(NoBackoff(), 0)


class Namespace(enum.StrEnum):
    SHOP = "shop"


ARGS: list[Any] = ["namespace", "", "clé", b"\x00\xff:-\r\n", 0, -7, 2**70]


def test_a_call_is_packed_as_redis_py_packs_it() -> None:
    client = redis.Redis.from_url(REDIS_URL)
    connection = client.connection_pool.make_connection()
    packed = b"".join(connection.pack_command("EVALSHA", "f" * 40, 1, "key", *ARGS))

    assert pack("f" * 40, "key", ARGS) == packed


def test_subclasses_floats_and_views_are_packed_as_redis_py_packs_them() -> None:
    subclassed: list[Any] = [Namespace.SHOP, mark_safe("Made"), HTTPStatus.CREATED]
    others: list[Any] = [1.5, -0.0, memoryview(b"\x00view")]
    connection = redis.Redis.from_url(REDIS_URL).connection_pool.make_connection()
    packed = b"".join(
        connection.pack_command("EVALSHA", "f" * 40, 1, "key", "shop", "Made", 201, *others)
    )

    assert pack("f" * 40, "key", [*subclassed, *others]) == packed


@pytest.mark.parametrize("refused", [True, None, ["secret-key"], {"secret": 1}])
def test_an_argument_redis_py_would_not_send_is_its_data_error_unshown(refused: Any) -> None:
    with pytest.raises(redis.exceptions.DataError, match="text, bytes or an int") as refusal:
        pack("f" * 40, "key", [refused])
    assert "secret" not in str(refusal.value)


@pytest.mark.single_node_redis
def test_the_answer_and_the_errors_are_redis_py_s() -> None:
    client = redis.Redis.from_url(REDIS_URL)
    sha = client.script_load("return {ARGV[1], tonumber(ARGV[2]) + 1, false, ARGV[3]}")

    assert call(client, sha, "key", ["a", 41, b"\x00"]) == [b"a", 42, None, b"\x00"]
    assert call(client, sha, "key", ["a", 41, b"\x00"]) == client.evalsha(
        sha, 1, "key", "a", 41, b"\x00"
    )
    with pytest.raises(redis.exceptions.NoScriptError):
        call(client, "0" * 40, "key", [])
    # A script error leaves the connection clean for the next call.
    failing = client.script_load("return redis.call('NOSUCHCOMMAND')")
    with pytest.raises(redis.exceptions.ResponseError):
        call(client, failing, "key", [])
    assert call(client, sha, "key", ["b", 1, b""]) == [b"b", 2, None, b""]


@pytest.mark.single_node_redis
def test_each_client_calls_on_a_connection_of_its_own_pool() -> None:
    # As under gevent, where the heartbeat's native thread has a client and pool of its own.
    shared, own = redis.Redis.from_url(REDIS_URL), redis.Redis.from_url(REDIS_URL)
    sha = shared.script_load("return 1")
    assert call(shared, sha, "k", []) == 1

    assert call(own, sha, "k", []) == 1
    assert len(own.connection_pool._available_connections) == 1
    assert len(shared.connection_pool._available_connections) == 1


@pytest.mark.single_node_redis
def test_clients_redis_py_must_serve_are_left_to_it() -> None:
    sha = redis.Redis.from_url(REDIS_URL).script_load("return 1")

    assert call(redis.Redis.from_url(REDIS_URL, decode_responses=True), sha, "k", []) is SLOW
    pinned = redis.Redis.from_url(REDIS_URL, single_connection_client=True)
    assert call(pinned, sha, "k", []) is SLOW

    class OwnClient(redis.Redis):  # type: ignore[type-arg]
        pass

    assert call(OwnClient.from_url(REDIS_URL), sha, "k", []) is SLOW


@pytest.mark.single_node_redis
def test_a_connection_the_server_closed_is_replaced_before_the_call() -> None:
    client = redis.Redis.from_url(REDIS_URL)
    sha = client.script_load("return 1")
    assert call(client, sha, "k", []) == 1
    client.client_kill_filter(_type="normal", skipme=False)  # Every connection, ours too.

    assert call(client, sha, "k", []) == 1


@pytest.fixture
def stalling_redis() -> Iterator[int]:
    """The port of a server that answers a connection's set-up (+OK to each command) and never
    answers a script call."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                peer, _ = listener.accept()
                while data := peer.recv(65536):
                    if b"EVALSHA" not in data:
                        peer.sendall(b"+OK\r\n" * data.count(b"*"))

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1]
    listener.close()


def test_a_call_whose_reply_failed_is_left_to_redis_py_s_retries(stalling_redis: int) -> None:
    retrying = redis.Redis(
        port=stalling_redis, socket_timeout=0.2, protocol=2, retry=Retry(NoBackoff(), 1)
    )
    assert call(retrying, "f" * 40, "k", []) is SLOW  # redis-py's call then tries again.

    once = redis.Redis(port=stalling_redis, socket_timeout=0.2, protocol=2, retry=NO_RETRY)
    with pytest.raises(redis.exceptions.TimeoutError):
        call(once, "f" * 40, "k", [])  # As redis-py's call raises it, without a retry.


def test_a_failure_the_client_does_not_retry_is_raised_as_redis_py_raises_it(
    stalling_redis: int,
) -> None:
    only_lost_connections = Retry(NoBackoff(), 2, supported_errors=(redis.ConnectionError,))
    client = redis.Redis(
        port=stalling_redis, socket_timeout=0.2, protocol=2, retry=only_lost_connections
    )
    with pytest.raises(redis.exceptions.TimeoutError):
        call(client, "f" * 40, "k", [])  # Not sent again: redis-py would not retry a timeout.


def test_a_dropped_client_s_pool_is_not_kept_alive() -> None:
    client = redis.Redis.from_url(REDIS_URL)
    sha = client.script_load("return 1")
    assert call(client, sha, "k", []) == 1
    pool = weakref.ref(client.connection_pool)

    del client
    gc.collect()
    assert pool() is None


def test_a_connection_that_cannot_be_had_fails_as_in_redis_py() -> None:
    nobody = redis.Redis(port=9, socket_connect_timeout=0.2, retry=NO_RETRY)
    with pytest.raises(redis.exceptions.ConnectionError):
        call(nobody, "f" * 40, "k", [])


@pytest.mark.parametrize(
    "fields",
    [
        [b"completed", b"", None, b"0:-", b"-", b"12:x", *[None] * 7],
        [None] * 13,
        [b"\x00" * 300, *[b":"] * 12],
    ],
)
def test_a_record_read_back_is_one_reply_whose_fields_come_out_whole(
    redis_store: RedisStore, fields: list[bytes | None]
) -> None:
    connection = redis_store.connection()
    # A field the record lacks is false in the script, as HMGET answers it.
    script = "local found = {}\nfor i = 1, 13 do found[i] = ARGV[i] ~= '<none>' and ARGV[i] end\n"
    sha = connection.script_load(_PACKED + script + "return packed(found)")
    args = [b"<none>" if value is None else value for value in fields]
    assert _fields(connection.evalsha(sha, 1, "k", *args)) == fields


def test_a_replay_is_the_stored_response_through_the_packed_reply(redis_store: RedisStore) -> None:
    client = Client()
    first = post(client, "/function/charges/", {"amount": 5, "note": "a:b-c"})
    again = post(client, "/function/charges/", {"amount": 5, "note": "a:b-c"})

    assert again.status_code == first.status_code
    assert again.content == first.content
    assert again[REPLAYED_HEADER] == "true"
    record = redis_store.read(Scope("default", "", "key-1"))
    assert record is not None and record.status == "completed"
    assert isinstance(record.response, StoredResponse) and record.response.body == first.content


@pytest.mark.single_node_redis
def test_a_redis_that_lost_its_scripts_is_given_them_again(redis_store: RedisStore) -> None:
    client = Client()
    first = post(client, "/function/charges/", key="before")
    redis_store.connection().script_flush()  # As a restarted Redis has none.

    second = post(client, "/function/charges/", key="after")
    redis_store.connection().script_flush()
    again = post(client, "/function/charges/", key="after")

    assert (first.status_code, second.status_code, again.status_code) == (201, 201, 201)
    assert again[REPLAYED_HEADER] == "true"
    assert again.content == second.content


RUNS: list[int] = []


@idempotent(namespace=Namespace.SHOP)
def enum_view(request: HttpRequest) -> HttpResponse:
    """A view whose namespace, status and reason are subclasses of str and int."""
    RUNS.append(1)
    response = HttpResponse(b"made", reason=mark_safe("Made"))
    response.status_code = HTTPStatus.CREATED
    return response


class URLs:
    urlpatterns = [path("made/", enum_view)]


def test_a_view_whose_values_subclass_str_and_int_runs_once_and_is_replayed_as_it_was(
    redis_store: RedisStore,
) -> None:
    RUNS.clear()
    with override_settings(ROOT_URLCONF=URLs):
        first = post(Client(), "/made/", key="made")
        again = post(Client(), "/made/", key="made")

    assert (first.status_code, first.reason_phrase, first.content) == (201, "Made", b"made")
    assert (again.status_code, again.reason_phrase, again.content) == (201, "Made", b"made")
    assert again[REPLAYED_HEADER] == "true"
    assert RUNS == [1]
