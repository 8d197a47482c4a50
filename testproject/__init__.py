"""A small payments API that shows django-idempotency at work."""
