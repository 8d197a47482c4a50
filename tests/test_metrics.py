"""Prometheus metrics, read back from the default registry after real requests and purges."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.apps import apps
from django.core.management import call_command
from django.test import Client, override_settings
from django.utils import timezone
from prometheus_client import REGISTRY

import tests
from django_idempotency import signals
from django_idempotency.conf import conf
from django_idempotency.contrib import prometheus
from django_idempotency.purge import purge_expired_records
from django_idempotency.stores.cache import CacheTier
from tests.factories import IdempotencyRecordFactory
from tests.utils import clear_own_keys, fingerprint_of, post, redis_caches

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:63799")
URL = "/function/charges/"
PREFIX = "django_idempotency_"
OUTCOMES = PREFIX + "outcomes_total"
CHECKS = PREFIX + "check_duration_seconds"
UID = "django_idempotency.contrib.prometheus."  # The dispatch_uid prefix of its receivers.

Delta = Callable[..., float]


def _samples() -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in REGISTRY.collect()
        if family.name.startswith(PREFIX)
        for sample in family.samples
    }


@pytest.fixture
def delta() -> Delta:
    """How much a sample has grown since the test started (metrics live for the process)."""
    before = _samples()

    def grown(name: str, **labels: str) -> float:
        key = (name, frozenset(labels.items()))
        return _samples().get(key, 0.0) - before.get(key, 0.0)

    return grown


def outcomes(delta: Delta, namespace: str = "default") -> dict[str, float]:
    names = ("claimed", "replayed", "conflict", "mismatch", "completed", "released")
    counts = {name: delta(OUTCOMES, namespace=namespace, outcome=name) for name in names}
    return {name: count for name, count in counts.items() if count}


@pytest.mark.django_db
def test_a_fresh_request_counts_a_claim_and_a_completion(delta: Delta) -> None:
    assert post(Client(), URL).status_code == 201

    assert outcomes(delta) == {"claimed": 1, "completed": 1}
    assert delta(CHECKS + "_count", namespace="default") == 1  # Completion is not a check.
    assert delta(CHECKS + "_sum", namespace="default") > 0


@pytest.mark.django_db
def test_a_retry_counts_a_replay(delta: Delta) -> None:
    client = Client()
    post(client, URL)
    retry = post(client, URL)

    assert retry["Idempotent-Replayed"] == "true"
    assert outcomes(delta) == {"claimed": 1, "completed": 1, "replayed": 1}
    assert delta(CHECKS + "_count", namespace="default") == 2


@pytest.mark.django_db
def test_a_different_body_counts_a_mismatch(delta: Delta) -> None:
    client = Client()
    post(client, URL, {"amount": 1})
    assert post(client, URL, {"amount": 2}).status_code == 422

    assert outcomes(delta) == {"claimed": 1, "completed": 1, "mismatch": 1}


@pytest.mark.django_db
def test_a_duplicate_of_a_running_request_counts_a_conflict(delta: Delta) -> None:
    running = fingerprint_of(URL, {"amount": 10})
    IdempotencyRecordFactory(in_progress=True, key="key-1", fingerprint=running)
    assert post(Client(), URL, {"amount": 10}).status_code == 409

    assert outcomes(delta) == {"conflict": 1}


@pytest.mark.django_db
def test_a_response_that_is_not_stored_counts_a_release(delta: Delta) -> None:
    assert post(Client(), URL, outcome="invalid").status_code == 400

    assert outcomes(delta) == {"claimed": 1, "released": 1}


@pytest.mark.django_db
def test_outcomes_and_latency_are_labelled_by_namespace(delta: Delta) -> None:
    post(Client(), "/viewset/charges/refund/")

    assert outcomes(delta, "refunds") == {"claimed": 1, "completed": 1}
    assert outcomes(delta) == {}
    assert delta(CHECKS + "_count", namespace="refunds") == 1


@pytest.mark.django_db
def test_check_latency_lands_in_sub_millisecond_to_second_buckets(delta: Delta) -> None:
    post(Client(), URL)

    assert delta(CHECKS + "_bucket", namespace="default", le="1.0") == 1
    assert delta(CHECKS + "_bucket", namespace="default", le="+Inf") == 1
    bounds = [
        float(dict(labels)["le"])
        for name, labels in _samples()
        if name == CHECKS + "_bucket" and dict(labels)["namespace"] == "default"
    ]
    assert min(bounds) <= 0.0005
    assert 1.0 in bounds


@pytest.mark.django_db
def test_idempotency_metrics_false_counts_nothing(delta: Delta) -> None:
    client = Client()
    with override_settings(IDEMPOTENCY_METRICS=False):
        post(client, URL)
        post(client, URL)

        signals.cache_lookup.send_robust(sender=CacheTier, hit=True, namespace="default")

    assert outcomes(delta) == {}
    assert delta(CHECKS + "_count", namespace="default") == 0
    assert delta(HITS) == 0


# The cache tier on a real Redis, configured as in test_cache.py.


@pytest.fixture
def redis_tier() -> Iterator[None]:
    location = f"{REDIS_URL}/3"
    with override_settings(CACHES=redis_caches(location), IDEMPOTENCY_CACHE="idempotency"):
        clear_own_keys()  # Fails loudly when Redis is not running.
        yield
        clear_own_keys()


HITS = PREFIX + "cache_hits_total"
MISSES = PREFIX + "cache_misses_total"


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)  # Records reach the cache after their commit.
def test_a_replay_from_the_cache_is_a_hit_and_a_new_key_a_miss(
    redis_tier: None, delta: Delta
) -> None:
    client = Client()
    post(client, URL)
    assert (delta(HITS), delta(MISSES)) == (0, 1)

    assert post(client, URL)["Idempotent-Replayed"] == "true"
    assert (delta(HITS), delta(MISSES)) == (1, 1)

    assert post(client, URL, {"amount": 2}).status_code == 422  # Answered from the cache too.
    assert (delta(HITS), delta(MISSES)) == (2, 1)
    assert outcomes(delta) == {"claimed": 1, "completed": 1, "replayed": 1, "mismatch": 1}


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_a_cache_error_is_a_miss(delta: Delta) -> None:
    # Nothing listens on port 9: every cache call fails, and the store answers.
    with override_settings(
        CACHES=redis_caches("redis://127.0.0.1:9/0"), IDEMPOTENCY_CACHE="idempotency"
    ):
        client = Client()
        post(client, URL)
        assert post(client, URL)["Idempotent-Replayed"] == "true"

    assert (delta(HITS), delta(MISSES)) == (0, 2)


@pytest.mark.django_db
def test_without_the_cache_tier_nothing_is_a_hit_or_a_miss(delta: Delta) -> None:
    client = Client()
    post(client, URL)
    post(client, URL)

    assert (delta(HITS), delta(MISSES)) == (0, 0)


# Purges.

PURGED = PREFIX + "purged_records_total"
PURGE_SECONDS = PREFIX + "purge_duration_seconds"


@pytest.fixture
def leftovers() -> None:
    past = timezone.now() - timedelta(minutes=5)
    IdempotencyRecordFactory.create_batch(3, expires_at=past)
    # Abandoned claims past their expiry (a crashed claim within its TTL stays for its retry).
    IdempotencyRecordFactory.create_batch(
        2, in_progress=True, lease_expires_at=past, expires_at=past
    )
    IdempotencyRecordFactory()  # Live: never purged.


@pytest.mark.django_db
def test_a_purge_counts_records_by_kind_and_times_the_run(leftovers: None, delta: Delta) -> None:
    call_command("idempotency_purge", stdout=StringIO())

    assert delta(PURGED, kind="expired") == 3
    assert delta(PURGED, kind="abandoned") == 2
    assert delta(PURGE_SECONDS + "_count") == 1
    assert delta(PURGE_SECONDS + "_sum") > 0


@pytest.mark.django_db
def test_a_dry_run_counts_nothing(leftovers: None, delta: Delta) -> None:
    call_command("idempotency_purge", "--dry-run", stdout=StringIO())

    assert delta(PURGED, kind="expired") == delta(PURGED, kind="abandoned") == 0
    assert delta(PURGE_SECONDS + "_count") == 0


@pytest.mark.django_db
@pytest.mark.usefixtures("leftovers")
def test_idempotency_metrics_false_counts_no_purge(delta: Delta) -> None:
    with override_settings(IDEMPOTENCY_METRICS=False):
        purge_expired_records()

    assert delta(PURGED, kind="expired") == delta(PURGE_SECONDS + "_count") == 0


def broken_receiver(sender: object, **kwargs: object) -> None:
    raise RuntimeError("the statsd host is gone")


@pytest.mark.django_db
@pytest.mark.usefixtures("leftovers")
def test_a_failing_receiver_of_another_library_stops_no_metric(delta: Delta) -> None:
    # Connected first, so it raises before the metrics' receivers run.
    for signal, name in ((signals.purged, "purged"), (signals.cache_lookup, "cache_lookup")):
        signal.disconnect(dispatch_uid=UID + name)
        signal.connect(broken_receiver)
    prometheus.install()
    try:
        report = purge_expired_records()
        signals.cache_lookup.send_robust(sender=CacheTier, hit=False, namespace="default")
    finally:
        signals.purged.disconnect(broken_receiver)
        signals.cache_lookup.disconnect(broken_receiver)

    assert report.total == 5
    assert delta(PURGED, kind="expired") == 3
    assert delta(PURGE_SECONDS + "_count") == 1
    assert delta(MISSES) == 1


# Registration.


def test_metrics_are_named_prefixed_and_documented() -> None:
    prometheus.get_metrics()
    families = {family.name: family for family in REGISTRY.collect()}

    for name in (
        "outcomes",
        "check_duration_seconds",
        "cache_hits",
        "cache_misses",
        "purged_records",
        "purge_duration_seconds",
    ):
        assert families[PREFIX + name].documentation, name


def test_running_ready_again_registers_and_connects_nothing_twice() -> None:
    registered = prometheus.get_metrics()
    every_signal = {
        **signals.BY_OUTCOME,
        "cache_lookup": signals.cache_lookup,
        "purged": signals.purged,
    }
    receivers = {name: len(signal.receivers) for name, signal in every_signal.items()}

    apps.get_app_config("django_idempotency").ready()
    prometheus.install()

    assert prometheus.get_metrics() is registered
    assert {name: len(s.receivers) for name, s in every_signal.items()} == receivers
    uids = {uid for signal in every_signal.values() for (uid, _), *_ in signal.receivers}
    assert {UID + name for name in every_signal} <= uids


WITHOUT_PROMETHEUS = textwrap.dedent(
    """
    import json, sys
    sys.modules["prometheus_client"] = None  # `import prometheus_client` now fails.

    import django
    from django.core.management import call_command
    from django.test import Client

    django.setup()
    call_command("migrate", run_syncdb=True, verbosity=0)

    from django_idempotency import signals

    client = Client()
    headers = {"Idempotency-Key": "key-1"}
    responses = [
        client.post("/function/charges/", {"amount": 1}, "application/json", headers=headers)
        for _ in range(2)
    ]
    call_command("idempotency_purge", verbosity=0)
    uids = [
        str(lookup_key)
        for signal in (
            signals.claimed, signals.replayed, signals.completed, signals.released,
            signals.cache_lookup, signals.purged,
        )
        for lookup_key, *_ in signal.receivers
    ]
    print(json.dumps({
        "statuses": [response.status_code for response in responses],
        "replayed": responses[1].headers.get("Idempotent-Replayed"),
        "loaded": sorted(
            name for name, module in sys.modules.items()
            if module is not None and "prometheus" in name
        ),
        "prometheus_receivers": [uid for uid in uids if "prometheus" in uid],
    }))
    """
)


def test_without_prometheus_client_nothing_is_imported_or_connected(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'metrics.sqlite3'}",
        "PYTHONPATH": str(Path(tests.__file__).resolve().parent.parent),
    }
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_PROMETHEUS],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["statuses"] == [201, 201]
    assert report["replayed"] == "true"
    assert report["loaded"] == []
    assert report["prometheus_receivers"] == []


def test_idempotency_metrics_defaults_to_true() -> None:
    assert conf.METRICS is True
    with override_settings(IDEMPOTENCY_METRICS=False):
        assert conf.METRICS is False
