"""A process that claims a key in lease mode and holds it, running, until it is killed."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from django_idempotency import idempotent_function

LEASE = 1.0  # Seconds: renewed while the process lives, run out within one once it is killed.


@idempotent_function(key="key", payload=["key"], mode="lease", lease=LEASE)
def hold_the_key(key: str, marker: str, seconds: float) -> str:
    """Say (by creating `marker`) that the key is claimed, then work for `seconds`."""
    Path(marker).touch()
    time.sleep(seconds)
    return "ran"


if __name__ == "__main__":
    import django

    django.setup()
    # Imported by its name, not run as __main__: the label of the function, and with it the
    # record's path, is then the one the test process calls it by.
    from tests.lease_holder import hold_the_key as holder

    holder(sys.argv[1], sys.argv[2], float(sys.argv[3]))
