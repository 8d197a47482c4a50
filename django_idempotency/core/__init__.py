"""Framework-free heart of django-idempotency: keys, fingerprints and the claim state machine."""
