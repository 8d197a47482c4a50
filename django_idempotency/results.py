"""How idempotent functions and tasks store their results: JSON, with dataclasses and pydantic."""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Callable
from typing import Any, Protocol


class ResultSerializer(Protocol):
    """Turns a result into bytes to store, and stored bytes back into an equal result."""

    content_type: str

    def dumps(self, value: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


class JSONSerializer:
    """JSON results; a dataclass or pydantic model result comes back as the same type.

    ``result_type`` is the type replays rebuild (a dataclass or a pydantic model class); None
    returns the decoded JSON as it is.
    """

    content_type = "application/json"

    def __init__(self, result_type: type | None = None) -> None:
        self.result_type = result_type

    def dumps(self, value: Any) -> bytes:
        return json.dumps(value, default=_jsonable, separators=(",", ":")).encode()

    def loads(self, data: bytes) -> Any:
        value = json.loads(data)
        return value if self.result_type is None else _build(self.result_type, value)


def serializer_for(func: Callable[..., Any]) -> JSONSerializer:
    """The default serializer: JSON, rebuilding the return annotation's dataclass or model."""
    try:
        returns = typing.get_type_hints(func).get("return")
    except Exception:  # An annotation that cannot be resolved here: plain JSON it is.
        returns = None
    return JSONSerializer(returns if _is_buildable(returns) else None)


def _is_buildable(value: Any) -> bool:
    return isinstance(value, type) and (
        dataclasses.is_dataclass(value) or hasattr(value, "model_validate")
    )


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):
        return model_dump(mode="json")
    raise TypeError(
        f"A result of type {type(value).__name__} is not JSON-serialisable: return JSON data, a "
        "dataclass or a pydantic model, or pass serializer= to the decorator."
    )


def _build(result_type: type, value: Any) -> Any:
    model_validate = getattr(result_type, "model_validate", None)
    if callable(model_validate):
        return model_validate(value)
    if dataclasses.is_dataclass(result_type) and isinstance(value, dict):
        hints = typing.get_type_hints(result_type)
        return result_type(
            **{
                name: _build(hints[name], item) if _is_buildable(hints.get(name)) else item
                for name, item in value.items()
            }
        )
    return value
