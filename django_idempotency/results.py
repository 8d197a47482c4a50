"""How idempotent functions and tasks store their results: JSON, with dataclasses and pydantic."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import typing
import weakref
from collections.abc import Callable
from typing import Any, Protocol


class ResultSerializer(Protocol):
    """Turns a result into bytes to store, and stored bytes back into an equal result."""

    content_type: str

    def dumps(self, value: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


class ResultNotReplayable(TypeError):
    """A result the serializer would not give back as it was returned; the message says where."""


class JSONSerializer:
    """JSON results; a dataclass or pydantic model result comes back as the same type.

    ``result_type`` is the type replays rebuild (a dataclass or a pydantic model class); None
    returns the decoded JSON as it is. ``strict`` (the default) refuses, with
    `ResultNotReplayable`, a result whose replay would differ from it in value or type (a tuple
    would come back as a list, an int key as a str); ``strict=False`` stores the JSON form.
    """

    content_type = "application/json"

    def __init__(self, result_type: type | None = None, *, strict: bool = True) -> None:
        self.result_type = result_type
        self.strict = strict

    def dumps(self, value: Any) -> bytes:
        data = json.dumps(value, default=_jsonable, separators=(",", ":")).encode()
        if self.strict:
            self._check_replay(value, data)
        return data

    def _check_replay(self, value: Any, data: bytes) -> None:
        # Checked on the first call, while the caller can still change what it returns: found
        # on a replay, a difference would surface long after, and in another process.
        try:
            difference = _difference(value, self.loads(data), "The result")
        except RecursionError:
            difference = "The result is nested too deeply to check"
        if difference is not None:
            raise ResultNotReplayable(
                f"{difference}, so a replay would not return what this call returned. Return "
                "lists, dicts with str keys and plain JSON values (or a dataclass or pydantic "
                "model named by the return annotation), or pass serializer= to the decorator "
                "(JSONSerializer(strict=False) stores the JSON form as it is)."
            )

    def loads(self, data: bytes) -> Any:
        value = json.loads(data)
        return value if self.result_type is None else _build(self.result_type, value)


def serializer_for(func: Callable[..., Any]) -> JSONSerializer:
    """The default serializer: JSON, rebuilding the return annotation's dataclass or model."""
    # Resolving annotations compiles them, for a step's function on every step it runs: once
    # per function (a method's, for a bound method made anew on each access).
    function = getattr(func, "__func__", func)
    try:
        return _serializers[function]
    except (KeyError, TypeError):  # Not resolved yet, or an object no weak reference can hold.
        pass
    serializer = _resolved(func)
    with contextlib.suppress(TypeError):
        _serializers[function] = serializer
    return serializer


def _resolved(func: Callable[..., Any]) -> JSONSerializer:
    try:
        returns = typing.get_type_hints(func).get("return")
    except Exception:  # An annotation that cannot be resolved here: plain JSON it is.
        returns = None
    return JSONSerializer(returns if _is_buildable(returns) else None)


# By the function itself, not its code: a module executed again (a reload, a sample run twice)
# defines other classes under the same annotations.
_serializers: weakref.WeakKeyDictionary[Any, JSONSerializer] = weakref.WeakKeyDictionary()


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


def _difference(value: Any, replay: Any, where: str) -> str | None:
    """Where `replay` differs from `value` in type or value, or None if it does not."""
    if type(value) is not type(replay):
        return (
            f"{where} is of type {type(value).__name__} but would replay as {type(replay).__name__}"
        )
    if isinstance(value, dict):
        return _dict_difference(value, replay, where)
    if isinstance(value, list):
        if len(value) != len(replay):
            return f"{where} would replay with {len(replay)} items instead of {len(value)}"
        pairs = zip(value, replay, strict=True)
        return _first(_difference(a, b, f"{where}[{i}]") for i, (a, b) in enumerate(pairs))
    if dataclasses.is_dataclass(value):
        return _first(
            _difference(
                getattr(value, field.name), getattr(replay, field.name), f"{where}.{field.name}"
            )
            for field in dataclasses.fields(value)
        )
    if isinstance(value, float) and math.isnan(value) and math.isnan(replay):
        return None
    return None if value == replay else f"{where} would replay as {replay!r}"


def _dict_difference(value: dict[Any, Any], replay: dict[Any, Any], where: str) -> str | None:
    for key in value:
        if type(key) is not str:
            return (
                f"{where} has the key {key!r} of type {type(key).__name__}; a replay has only "
                "str keys"
            )
    if value.keys() != replay.keys():
        return f"{where} would replay with other keys"
    return _first(_difference(value[key], replay[key], f"{where}[{key!r}]") for key in value)


def _first(differences: typing.Iterable[str | None]) -> str | None:
    return next((difference for difference in differences if difference is not None), None)
