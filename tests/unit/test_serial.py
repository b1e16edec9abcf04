"""serial.json_form: the keys in the order given, renamed keys, computed entries, nested
records written by their own to_dict, and a computed key that names no entry refused."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from titan_rocm.serial import json_form


@dataclass
class Inner:
    value: int

    def to_dict(self) -> dict[str, int]:
        return {"v": self.value}


@dataclass
class Outer:
    a: int
    kernel_name: str
    inner: Inner | None
    missing: Inner | None = None


def test_keys_come_in_the_order_given_with_renames_computed_and_nested() -> None:
    form = json_form(Outer(1, "k", Inner(2)),
                     "kernelName=kernel_name extra a inner missing", extra=[3])
    assert list(form) == ["kernelName", "extra", "a", "inner", "missing"]
    assert form == {"kernelName": "k", "extra": [3], "a": 1, "inner": {"v": 2}, "missing": None}


def test_a_computed_key_outside_the_list_is_refused() -> None:
    with pytest.raises(ValueError, match="'typo'"):
        json_form(Outer(1, "k", None), "a", typo=1)
