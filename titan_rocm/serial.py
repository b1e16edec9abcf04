"""The one way a record of titan-rocm writes its JSON form.

The keys come in the order the outputs show them (``--json`` answers, stats files, docs quote
them and tests compare them), which is not always the order of the dataclass's fields, and a
few keys differ from the attribute's name or hold a computed value: :func:`json_form` takes
all three from one ordered list.
"""

from __future__ import annotations

from typing import Any


def json_form(record: object, keys: str, /, **given: object) -> dict[str, Any]:
    """``{key: value}`` for each name of ``keys`` (space-separated, in output order).

    A name is an attribute of ``record`` written under its own name (``line``), or
    ``key=attribute`` when the JSON key differs (``kernelName=kernel_name``); a name that is a
    key of ``given`` takes that value instead (a computed entry). A value with its own
    ``to_dict`` is written by it; None stays None.
    """
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
