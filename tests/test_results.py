"""How results are stored: what the JSON serializer rebuilds, and what it refuses to store."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from django_idempotency import idempotent_function
from django_idempotency.results import JSONSerializer, ResultNotReplayable
from tests.models import Charge
from tests.stores import stored

if TYPE_CHECKING:  # Never imported at run time: the annotation below cannot be resolved.
    from decimal import Decimal

pytestmark = pytest.mark.django_db


@dataclass
class Invoice:
    number: str
    total: int


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def test_a_result_nested_too_deeply_to_check_is_refused_and_its_key_released() -> None:
    @idempotent_function(key="reference", namespace="deep")
    def deep(reference: str) -> Any:
        return nested(600)  # JSON encodes and decodes it; comparing it would overflow the stack.

    with pytest.raises(ResultNotReplayable, match="The result is nested too deeply to check, so"):
        deep("r-1")

    assert not stored()


def test_a_lenient_serializer_stores_a_result_too_deep_to_check() -> None:
    serializer = JSONSerializer(strict=False)

    assert serializer.loads(serializer.dumps(nested(600))) == nested(600)


def test_a_return_annotation_that_cannot_be_resolved_replays_the_json_as_it_is() -> None:
    calls: list[str] = []

    @idempotent_function(key="reference", namespace="totals")
    def total(reference: str) -> dict[str, Decimal]:
        calls.append(reference)
        Charge.objects.create(reference=reference, amount=12)
        return {"total": 12}

    assert total("r-2") == total("r-2") == {"total": 12}
    assert calls == ["r-2"]


def test_a_result_other_than_the_serializers_type_replays_as_it_was() -> None:
    # The result type is rebuilt from its JSON object; anything else (None: nothing to invoice)
    # comes back as it was stored.
    calls: list[str] = []

    @idempotent_function(key="reference", serializer=JSONSerializer(Invoice))
    def invoice(reference: str) -> Invoice | None:
        calls.append(reference)
        return None if reference.startswith("free") else Invoice(reference, 30)

    assert invoice("free-1") is None
    assert invoice("free-1") is None
    assert invoice("paid-1") == invoice("paid-1") == Invoice("paid-1", 30)
    assert calls == ["free-1", "paid-1"]


def test_a_function_defined_again_from_the_same_source_gets_its_own_classes() -> None:
    """A module executed again (a reload) defines a new dataclass under the same annotation:
    the serializer of the new function rebuilds the new class, not the first one's."""
    from django_idempotency.results import serializer_for

    source = (
        "from __future__ import annotations\n"
        "import dataclasses\n"
        "@dataclasses.dataclass\n"
        "class Receipt:\n"
        "    amount: int\n"
        "def pay() -> Receipt:\n"
        "    return Receipt(5)\n"
    )
    first: dict[str, Any] = {"__name__": __name__}
    again: dict[str, Any] = {"__name__": __name__}
    exec(compile(source, "reloaded.py", "exec"), first)
    serializer_for(first["pay"])
    exec(compile(source, "reloaded.py", "exec"), again)

    rebuilt = serializer_for(again["pay"]).loads(b'{"amount": 5}')

    assert type(rebuilt) is again["Receipt"]
