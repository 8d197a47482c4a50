"""drf-spectacular integration: idempotent operations documented in generated OpenAPI schemas."""
