"""The storage policy: which responses record a decision and which mean nothing happened."""

from __future__ import annotations

from collections.abc import Collection


def should_store(
    status: int, *, stored_client_errors: Collection[int], store_server_errors: bool
) -> bool:
    """Store 1xx to 3xx and the 4xx that record a decision; release the rest so a retry can run."""
    if status < 400:
        return True
    if status < 500:
        return status in stored_client_errors
    return store_server_errors
