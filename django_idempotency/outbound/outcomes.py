"""What a call's attempts so far say about the work downstream: confirmed, failed or ambiguous."""

from __future__ import annotations

from typing import Any, Literal

from django_idempotency.outbound.policy import Failure, Result

Outcome = Literal["sending", "confirmed", "failed", "ambiguous"]

REPLAYED_HEADER = "Idempotent-Replayed"
# Answers that say the request was not done, and would not be by these attempts: the request is
# wrong or unauthorised (nothing to retry), or the downstream refused it before running it.
NOT_DONE_STATUSES = frozenset(
    {400, 401, 403, 404, 405, 406, 411, 412, 413, 414, 415, 422, 429, 431, 503}
)


def may_have_run(result: Result) -> bool:
    """The attempt may have done the work downstream although its answer does not say so."""
    if result.status is None:
        return result.failure is Failure.LOST
    # 409: a request with this key is running there now (sent by this call, or an earlier run).
    return result.status == 409 or (result.status >= 500 and result.status not in NOT_DONE_STATUSES)


def outcome_of(result: Result, *, earlier_may_have_run: bool) -> Outcome:
    """The outcome of a call whose last attempt came back with `result` and that stops there.

    An answer with the downstream's decision confirms it (2xx, 3xx, and the 4xx that record a
    decision, such as 402). A definite "not done" fails it, unless an earlier attempt may have
    run: then, as when the last attempt's answer was lost, the call is ambiguous.
    """
    if is_decision(result.status):
        return "confirmed"
    if may_have_run(result) or earlier_may_have_run:
        return "ambiguous"
    return "failed"


def is_decision(status: int | None) -> bool:
    """An answer that is the downstream's decision on the request: 2xx, 3xx, and the 4xx that
    record one (402 Payment Required, 410 Gone…), not those that say it was not done."""
    if status is None or status >= 500:
        return False
    return status < 400 or (status not in NOT_DONE_STATUSES and status != 409)


def was_replayed(response: Any) -> bool:
    """Whether the downstream answered with the stored response of an earlier request with the
    same key (`Idempotent-Replayed: true`): an httpx or a requests response, or any object
    with case-insensitive `headers`."""
    value = response.headers.get(REPLAYED_HEADER)
    return isinstance(value, str) and value.strip().lower() == "true"
