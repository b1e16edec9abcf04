"""The one way a record of titan-rocm writes its JSON form: outputs fix a key order that is not
always the fields', and rename or compute some keys, so one ordered list states all three."""

from __future__ import annotations

from typing import Any


def json_form(record: object, keys: str, /, **given: object) -> dict[str, Any]:
    """``{key: value}`` for each name of ``keys`` (space-separated, in output order); ``key=attr``
    renames, a name in ``given`` takes that value, a value with ``to_dict`` is written by it."""
    names = [name.partition("=") for name in keys.split()]
    unknown = sorted(set(given) - {key for key, _, _ in names})
    if unknown:
        raise ValueError(f"json_form: given keys {unknown} are not among {keys!r}")
    out: dict[str, Any] = {}
    for key, _, attribute in names:
        value = given[key] if key in given else getattr(record, attribute or key)
        to_dict = getattr(value, "to_dict", None)
        out[key] = to_dict() if callable(to_dict) else value
    return out
