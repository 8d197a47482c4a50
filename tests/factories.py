"""factory-boy factories for records and users."""

from __future__ import annotations

from datetime import timedelta

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone

from django_idempotency.core.keys import new_key
from django_idempotency.models import IdempotencyRecord


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")


class IdempotencyRecordFactory(factory.django.DjangoModelFactory):
    """A completed record by default; `in_progress=True` for a live leased claim."""

    class Meta:
        model = IdempotencyRecord

    class Params:
        in_progress = factory.Trait(
            status=IdempotencyRecord.Status.IN_PROGRESS,
            response_status=None,
            response_headers=[],
            response_body=None,
            completed_at=None,
            lease_expires_at=factory.LazyFunction(lambda: timezone.now() + timedelta(seconds=60)),
        )

    namespace = "default"
    owner = ""
    key = factory.Sequence(lambda n: f"key-{n}")
    fingerprint = "0" * 64
    status = IdempotencyRecord.Status.COMPLETED
    method = "POST"
    path = "/function/charges/"
    response_status = 201
    response_headers = factory.LazyFunction(lambda: [["Content-Type", "application/json"]])
    response_body = b'{"stored": true}'
    lease_token = factory.Faker("hexify", text="^" * 32)
    created_at = factory.LazyFunction(timezone.now)
    completed_at = factory.LazyFunction(timezone.now)
    expires_at = factory.LazyFunction(lambda: timezone.now() + timedelta(hours=24))
    operation_id = factory.LazyFunction(new_key)
