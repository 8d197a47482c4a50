"""The Django adapter: read requests, guard views, capture and replay responses."""
