"""The transactional outbox: task calls and requests written with the writes they follow from.

`enqueue_task` and `enqueue_request` write a message in the caller's transaction; the relay
(`relay_due`, `Relay`, the ``idempotency_relay`` command, the ``relay_outbox`` beat task) sends
it once that transaction has committed, with a key the receiver runs once. See docs/outbox.md.
"""

from __future__ import annotations

from django_idempotency.outbox.messages import enqueue_request, enqueue_task, outbox_alias
from django_idempotency.outbox.relay import Relay, RelayReport, relay_due

__all__ = ["Relay", "RelayReport", "enqueue_request", "enqueue_task", "outbox_alias", "relay_due"]
