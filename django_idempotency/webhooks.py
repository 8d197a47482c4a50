"""Webhook receivers: verify a Standard Webhooks signature before a delivery's key is claimed."""

from __future__ import annotations

import base64
import binascii
import hmac
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from django_idempotency.conf import to_timedelta
from django_idempotency.exceptions import DeliveryRejected
from django_idempotency.http.requests import django_request

DEFAULT_TOLERANCE = timedelta(minutes=5)
MAX_TIMESTAMP_DIGITS = 11


class StandardWebhooks:
    """A ``verify=`` for `@idempotent`: rejects forged and stale Standard Webhooks deliveries.

    ``secret`` is the endpoint's signing secret (``whsec_…``), or a callable returning it (read
    on each delivery, e.g. from settings). A delivery whose ``webhook-timestamp`` is further than
    ``tolerance`` from now, or whose ``webhook-signature`` holds no matching ``v1`` signature, is
    answered ``400 delivery-rejected`` before any record is written. Needs the ``webhooks`` extra.
    """

    def __init__(
        self, secret: str | Callable[[], str], *, tolerance: timedelta | float = DEFAULT_TOLERANCE
    ) -> None:
        self.secret = secret
        self.tolerance = to_timedelta(tolerance, "tolerance").total_seconds()
        if isinstance(secret, str):
            _signer(secret)  # A bad secret or a missing library fails at start-up.

    def __call__(self, request: Any) -> None:
        http_request = django_request(request)
        headers = http_request.headers
        message_id = headers.get("webhook-id", "")
        timestamp = headers.get("webhook-timestamp", "")
        signatures = headers.get("webhook-signature", "")
        if not (message_id and timestamp and signatures):
            raise DeliveryRejected(
                "The delivery lacks a webhook-id, webhook-timestamp or webhook-signature header."
            )
        sent_at = _unix_time(timestamp)
        skew = abs(time.time() - sent_at)
        if skew > self.tolerance:
            raise DeliveryRejected(
                f"The delivery was signed {skew:.0f} seconds away from now; the tolerance is "
                f"{self.tolerance:.0f}. Check the sender's clock, or it is a replayed delivery."
            )
        try:
            payload = http_request.body.decode()
        except UnicodeDecodeError:
            raise DeliveryRejected("The delivery's body is not UTF-8 text.") from None
        secret = self.secret if isinstance(self.secret, str) else self.secret()
        expected = _signer(secret).sign(
            message_id, datetime.fromtimestamp(sent_at, tz=UTC), payload
        )
        expected_bytes = base64.b64decode(expected.split(",", 1)[1])
        for candidate in signatures.split():
            version, _, value = candidate.partition(",")
            if version != "v1":
                continue
            try:
                if hmac.compare_digest(base64.b64decode(value, validate=True), expected_bytes):
                    return
            except (binascii.Error, ValueError):
                continue
        raise DeliveryRejected("No signature matches: check the endpoint's signing secret.")


def _unix_time(timestamp: str) -> int:
    # Plain ASCII digits only: int() also takes signs, "_", spaces and 400-digit numbers, and the
    # last overflow the float arithmetic below. 11 digits reach the year 5138, inside datetime.
    if not (timestamp.isascii() and timestamp.isdigit() and len(timestamp) <= MAX_TIMESTAMP_DIGITS):
        raise DeliveryRejected(
            "The webhook-timestamp header is not a Unix time: it must be whole seconds since "
            "1970, in plain digits. Check the sender follows Standard Webhooks."
        )
    return int(timestamp)


def _signer(secret: str) -> Any:
    try:
        from standardwebhooks.webhooks import Webhook
    except ImportError as exc:
        raise ImproperlyConfigured(
            "StandardWebhooks needs the standardwebhooks library: "
            'pip install "django-idempotency[webhooks]".'
        ) from exc
    try:
        return Webhook(secret)
    except Exception as exc:  # Empty, or not base64: a configuration error, not a bad delivery.
        raise ImproperlyConfigured(f"The webhook signing secret is not usable: {exc}") from exc
