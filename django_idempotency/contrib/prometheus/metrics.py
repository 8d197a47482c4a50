"""The metrics, registered in prometheus_client's default registry on first use, and their feeds."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Histogram

from django_idempotency import signals
from django_idempotency.conf import conf

if TYPE_CHECKING:
    from django_idempotency.models import OutboxMessage

PREFIX = "django_idempotency_"
UID_PREFIX = "django_idempotency.contrib.prometheus."

# A cache hit takes well under a millisecond, a claim on PostgreSQL a few; the top buckets catch
# a slow store and duplicates that wait (on_conflict="wait").
CHECK_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
# One run, from an idle table to millions of rows in batches.
PURGE_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
# One attempt of an outbound call: a nearby service in milliseconds, up to a client's timeout.
OUTBOUND_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# What the relay did with a message: signals.outbox_delivery's outcomes.
OUTBOX_OUTCOMES = ("sent", "retried", "dead", "lost")


@dataclass(frozen=True)
class Metrics:
    """Every metric of the app; `get_metrics()` returns the one registered instance."""

    outcomes: Counter
    check_duration: Histogram
    cache_hits: Counter
    cache_misses: Counter
    purged_records: Counter
    purge_duration: Histogram
    outbound_attempts: Counter
    outbound_duration: Histogram
    outbox_deliveries: Counter
    outbox_delivery_duration: Histogram


_metrics: Metrics | None = None
_lock = threading.Lock()
# Check latency children by namespace: `labels()` validates and locks on every call.
_timed: dict[str, Histogram] = {}


def get_metrics() -> Metrics:
    """The metrics; the first call registers them, exactly once per process."""
    global _metrics
    if _metrics is None:
        with _lock:
            if _metrics is None:
                _metrics = _register()
    return _metrics


def _register() -> Metrics:
    registered = Metrics(
        outcomes=Counter(
            PREFIX + "outcomes",
            "Idempotency outcomes: keys claimed, replayed, refused (conflict, mismatch), "
            "completed or released.",
            ["namespace", "outcome"],
        ),
        check_duration=Histogram(
            PREFIX + "check_duration_seconds",
            "Time the store (and cache tier) took to decide what to do with a key.",
            ["namespace"],
            buckets=CHECK_BUCKETS,
        ),
        cache_hits=Counter(
            PREFIX + "cache_hits",
            "Lookups the cache tier answered (a replay or a mismatch) without the store.",
        ),
        cache_misses=Counter(
            PREFIX + "cache_misses",
            "Lookups the cache tier passed on to the store: not cached, expired or a cache error.",
        ),
        purged_records=Counter(
            PREFIX + "purged_records",
            "Records deleted by purges: expired records and abandoned claims.",
            ["kind"],
        ),
        purge_duration=Histogram(
            PREFIX + "purge_duration_seconds",
            "Duration of each purge, dry runs excluded.",
            buckets=PURGE_BUCKETS,
        ),
        outbound_attempts=Counter(
            PREFIX + "outbound_attempts",
            "Attempts of outbound calls by target host and the call's outcome after each: "
            "sending (another attempt follows), confirmed, failed or ambiguous.",
            ["host", "outcome"],
        ),
        outbound_duration=Histogram(
            PREFIX + "outbound_attempt_duration_seconds",
            "Duration of each attempt of an outbound call, by target host.",
            ["host"],
            buckets=OUTBOUND_BUCKETS,
        ),
        outbox_deliveries=Counter(
            PREFIX + "outbox_deliveries",
            "Outbox messages the relay handled, by kind (task or request) and outcome: sent, "
            "retried (after the backoff), dead, or lost (taken over by another relay first).",
            ["kind", "outcome"],
        ),
        outbox_delivery_duration=Histogram(
            PREFIX + "outbox_delivery_seconds",
            "Duration of each delivery of an outbox message by the relay, by kind (lost ones,"
            " never sent, left out).",
            ["kind"],
            buckets=OUTBOUND_BUCKETS,
        ),
    )
    for kind in ("expired", "abandoned"):
        registered.purged_records.labels(kind)  # Both series exist from the start, at zero.
    # So do the outbox's: an alert on the first dead message sees it rise from zero.
    for kind in ("task", "request"):
        for outcome in OUTBOX_OUTCOMES:
            registered.outbox_deliveries.labels(kind, outcome)
    return registered


def install() -> None:
    """Connect the metrics to the signals; running it again changes nothing (dispatch_uid).

    Every receiver checks IDEMPOTENCY_METRICS on each event, so `override_settings` applies, and
    nothing is registered while it is False.
    """
    for outcome, signal in signals.BY_OUTCOME.items():
        signal.connect(
            _outcome_receiver(outcome),
            weak=False,
            dispatch_uid=f"{UID_PREFIX}{outcome}",
        )
    signals.cache_lookup.connect(count_lookup, weak=False, dispatch_uid=f"{UID_PREFIX}cache_lookup")
    signals.purged.connect(count_purge, weak=False, dispatch_uid=f"{UID_PREFIX}purged")
    signals.outbound_attempt.connect(
        count_outbound_attempt, weak=False, dispatch_uid=f"{UID_PREFIX}outbound_attempt"
    )
    signals.outbox_delivery.connect(
        count_outbox_delivery, weak=False, dispatch_uid=f"{UID_PREFIX}outbox_delivery"
    )


def _outcome_receiver(outcome: str) -> Callable[..., None]:
    # This outcome's children by namespace, as `_timed`; namespaces are few, set in code.
    counted: dict[str, Counter] = {}

    def receive(
        sender: Any, *, namespace: str, duration: float | None = None, **kwargs: Any
    ) -> None:
        if not conf.METRICS:
            return
        counter = counted.get(namespace)
        if counter is None:
            counter = counted[namespace] = get_metrics().outcomes.labels(namespace, outcome)
        counter.inc()
        if duration is not None:
            timed = _timed.get(namespace)
            if timed is None:
                timed = _timed[namespace] = get_metrics().check_duration.labels(namespace)
            timed.observe(duration)

    return receive


def count_lookup(sender: Any, *, hit: bool, **kwargs: Any) -> None:
    if conf.METRICS:
        metrics = get_metrics()
        (metrics.cache_hits if hit else metrics.cache_misses).inc()


def count_purge(sender: Any, *, report: Any, **kwargs: Any) -> None:
    # report: a purge.PurgeReport, untyped here so that the metrics (below the purge, which
    # reaches up to the outbound journal) do not import the purge for a signal's payload.
    if report.dry_run or not conf.METRICS:
        return  # A dry run deletes nothing; its time is that of a count.
    metrics = get_metrics()
    metrics.purged_records.labels("expired").inc(report.expired)
    metrics.purged_records.labels("abandoned").inc(report.abandoned)
    metrics.purge_duration.observe(report.seconds)


def count_outbound_attempt(
    sender: Any, *, host: str, outcome: str, duration: float, **kwargs: Any
) -> None:
    if not conf.METRICS:
        return
    metrics = get_metrics()
    metrics.outbound_attempts.labels(host, outcome).inc()
    metrics.outbound_duration.labels(host).observe(duration)


def count_outbox_delivery(
    sender: Any, *, message: OutboxMessage, outcome: str, duration: float, **kwargs: Any
) -> None:
    if not conf.METRICS:
        return
    metrics = get_metrics()
    metrics.outbox_deliveries.labels(message.kind, outcome).inc()
    if outcome != "lost":  # Another relay had taken it over: this one sent nothing to time.
        metrics.outbox_delivery_duration.labels(message.kind).observe(duration)
