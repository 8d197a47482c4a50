"""Canonical request fingerprints: equal requests hash equal, whatever their incidental encoding."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Collection, Iterable
from typing import Any
from urllib.parse import parse_qsl, urlencode

import rfc8785

# Beyond ±2^53 a double no longer holds every integer: RFC 8785 would collapse neighbours into
# one value, so such integers keep their exact decimal form (two account numbers stay two).
_EXACT_INT_LIMIT = 2**53


class UnreadableBody(ValueError):
    """The body cannot be put in canonical form (nested too deeply); the message says why."""


def canonical_json(value: Any) -> bytes:
    """JSON per RFC 8785 (JCS): keys sorted, no whitespace, numbers in canonical form.

    ``1``, ``1.0`` and ``1e0`` are one value. Integers beyond ±2^53 are written exactly.
    """
    try:
        if not _needs_jcs(value):
            # No floats and no keys outside the Basic Multilingual Plane: the standard
            # library's output is byte for byte the JCS form, and far faster.
            text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        else:
            text = "".join(_jcs_parts(value, []))
    except RecursionError as exc:
        raise UnreadableBody("The JSON body is nested too deeply to compare.") from exc
    # "\ud800" is valid JSON but a lone surrogate in Python: keep it rather than fail.
    return text.encode("utf-8", "surrogatepass")


def _needs_jcs(value: Any) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        return any(
            _needs_jcs(item) or (not name.isascii() and max(name) > "\uffff")
            for name, item in value.items()
        )
    if isinstance(value, (list, tuple)):
        return any(_needs_jcs(item) for item in value)
    return False


def _jcs_parts(value: Any, out: list[str]) -> list[str]:
    if isinstance(value, float) and math.isfinite(value):
        out.append(rfc8785.dumps(value).decode())
    elif isinstance(value, dict):
        out.append("{")
        # RFC 8785 §3.2.3: keys ordered by their UTF-16 code units.
        names = sorted(value, key=lambda name: name.encode("utf-16-be", "surrogatepass"))
        for index, name in enumerate(names):
            out.append("," if index else "")
            out.append(json.dumps(name, ensure_ascii=False))
            out.append(":")
            _jcs_parts(value[name], out)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for index, item in enumerate(value):
            out.append("," if index else "")
            _jcs_parts(item, out)
        out.append("]")
    else:  # Strings escape as RFC 8785 asks; integers, booleans and null are already exact;
        # NaN and Infinity (which Python's parser accepts) have no canonical form: kept as read.
        out.append(json.dumps(value, ensure_ascii=False))
    return out


def is_json_media_type(media_type: str) -> bool:
    return media_type == "application/json" or media_type.endswith("+json")


def canonical_body(media_type: str, body: bytes, ignore_fields: Collection[str] = ()) -> bytes:
    """The body in canonical form: JSON canonicalised, form data sorted, anything else raw.

    Raises `UnreadableBody` for JSON nested too deeply to parse.
    """
    if is_json_media_type(media_type):
        try:
            data = json.loads(body)
        except RecursionError as exc:
            raise UnreadableBody("The JSON body is nested too deeply to compare.") from exc
        except ValueError:
            return body  # Not valid JSON: the raw bytes are all there is to compare.
        if ignore_fields and isinstance(data, dict):
            data = {name: item for name, item in data.items() if name not in ignore_fields}
        return canonical_json(data)
    if media_type == "application/x-www-form-urlencoded":
        try:
            text = body.decode()
        except UnicodeDecodeError:
            return body
        return canonical_form(parse_qsl(text, keep_blank_values=True), ignore_fields)
    return body


def canonical_form(pairs: Iterable[tuple[str, str]], ignore_fields: Collection[str] = ()) -> bytes:
    """Form fields sorted by name; a repeated field keeps the order of its values.

    ``to=a&to=b`` and ``to=b&to=a`` differ (a view reading ``request.POST["to"]`` sees another
    value); ``a=1&b=2`` and ``b=2&a=1`` do not.
    """
    kept = [pair for pair in pairs if pair[0] not in ignore_fields]
    return urlencode(sorted(kept, key=lambda pair: pair[0])).encode()


def canonical_multipart(
    fields: Iterable[tuple[str, str]],
    files: Iterable[tuple[str, str, str]],
    ignore_fields: Collection[str] = (),
) -> bytes:
    """Multipart bodies by their fields and file digests, not by the random boundary.

    ``files`` holds ``(field name, file name, SHA-256 hex digest of the content)`` triples.
    Fields and files are sorted by name, keeping the order of a repeated name's values.
    """
    return canonical_json(
        {
            "fields": [
                [name, value]
                for name, value in sorted(fields, key=lambda pair: pair[0])
                if name not in ignore_fields
            ],
            "files": [list(triple) for triple in sorted(files, key=lambda triple: triple[0])],
        }
    )


def fingerprint(method: str, path: str, body: bytes) -> str:
    """SHA-256 (hex) over the method, the path with its query string, and the canonical body."""
    digest = hashlib.sha256()
    for part in (method.upper().encode(), path.encode()):
        digest.update(len(part).to_bytes(4, "big"))
        digest.update(part)
    digest.update(body)
    return digest.hexdigest()
