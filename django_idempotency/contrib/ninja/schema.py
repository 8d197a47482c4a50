"""The key header, the problem responses and the expiry in a Ninja operation's OpenAPI schema."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ninja.operation import Operation

from django_idempotency.http import openapi
from django_idempotency.http.options import Options, resolve
from django_idempotency.http.requests import SAFE_METHODS


class SchemaExtra(dict[str, Any]):
    """An operation's ``openapi_extra``, which Ninja merges into the operation's schema: the
    project's own, with the key header, problem responses, replay header and `x-idempotency`.

    Computed whenever Ninja reads it, so the settings in force when the schema is generated
    are the ones documented (as for the guard, which reads them on each request).
    """

    def __init__(self, operation: Operation, options: Options, own: Mapping[str, Any] | None):
        super().__init__()
        self.operation = operation
        self.options = options
        self.own = dict(own or {})

    def current(self) -> dict[str, Any]:
        extra = _documented(self.operation, self.options)
        for key, value in self.own.items():  # The project's own extra wins.
            if isinstance(value, dict) and isinstance(extra.get(key), dict):
                extra[key] = {**extra[key], **value}
            elif isinstance(value, list) and isinstance(extra.get(key), list):
                extra[key] = [*extra[key], *value]
            else:
                extra[key] = value
        return extra

    def __len__(self) -> int:
        return len(self.current())

    def __iter__(self) -> Iterator[str]:
        return iter(self.current())

    def __getitem__(self, key: str) -> Any:
        return self.current()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.current()

    def keys(self) -> Any:
        return self.current().keys()

    def items(self) -> Any:
        return self.current().items()

    def values(self) -> Any:
        return self.current().values()

    def get(self, key: str, default: Any = None) -> Any:
        return self.current().get(key, default)

    def __repr__(self) -> str:
        return repr(self.current())


def _documented(operation: Operation, options: Options) -> dict[str, Any]:
    if all(method.upper() in SAFE_METHODS for method in operation.methods):
        return {}
    resolved = resolve(options, None)
    declared = [status for status in operation.response_models if isinstance(status, int)]
    # The operation's own statuses, to which the replay header (2xx) or the problem document
    # (a 400 of its own) is added; those it does not declare get a description too.
    responses: dict[str, Any] = {str(status): {} for status in declared}
    openapi.document_responses(responses, resolved, openapi.PROBLEM_SCHEMA)
    return {
        "parameters": [
            {
                "in": "header",
                "name": resolved.header,
                "schema": openapi.key_schema(),
                "required": resolved.required,
                "description": openapi.key_description(resolved),
            }
        ],
        # Ninja's own responses are keyed by int status: merged into them, not beside them.
        "responses": {int(status): response for status, response in responses.items()},
        openapi.EXTENSION: openapi.extension(resolved),
    }
