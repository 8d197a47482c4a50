"""`idempotency_purge`: delete expired records and abandoned claims."""
