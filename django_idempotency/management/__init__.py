"""Management commands of django-idempotency."""
