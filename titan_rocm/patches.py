"""The one way titan-rocm replaces an attribute of code it does not own, and puts it back
(docs/architecture.md, "Patching code titan-rocm does not own").

A patch someone else has since replaced is forgotten, not restored: what stands there now is
not titan-rocm's to take away."""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import threading
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

_ABSENT: Any = object()
"""Nothing stood in the owner's own namespace (the attribute was inherited, or missing)."""


def _config_entry(owner: Any, name: str) -> Any:
    """torch/utils/_config_module.py (torch 2.13): the user's value lives in the entry's
    ``user_override`` ContextVar, which ``_is_default`` and the config's hash read."""
    if isinstance(owner, (dict, MutableMapping)) or not hasattr(owner, "__dict__"):
        return None
    table = vars(owner).get("_config")
    entry = table.get(name) if isinstance(table, dict) else None
    return entry if isinstance(getattr(entry, "user_override", None), contextvars.ContextVar) \
        else None


def _unset_sentinel(owner: Any) -> Any:
    return getattr(sys.modules.get(type(owner).__module__), "_UNSET_SENTINEL", _ABSENT)


def _own(owner: Any, name: str) -> Any:
    if isinstance(owner, (dict, MutableMapping)):
        return owner.get(name, _ABSENT)
    entry = _config_entry(owner, name)
    if entry is not None:
        value = entry.user_override.get()
        return _ABSENT if value is _unset_sentinel(owner) else value
    return vars(owner).get(name, _ABSENT) if hasattr(owner, "__dict__") else _ABSENT


def _lookup(owner: Any, name: str) -> Any:
    if isinstance(owner, (dict, MutableMapping)):
        if name not in owner:
            raise AttributeError(f"namespace {describe(owner)} has no {name!r}")
        return owner[name]
    return getattr(owner, name)


def _put(owner: Any, name: str, value: Any) -> None:
    if isinstance(owner, (dict, MutableMapping)):
        if value is _ABSENT:
            owner.pop(name, None)
        else:
            owner[name] = value
        return
    entry = _config_entry(owner, name)
    if value is _ABSENT and entry is not None:
        # Deleting is how the config module forgets a user's value (unittest.mock's
        # undo); it also hides the option until set again, which the option must not stay.
        delattr(owner, name)
        entry.hide = False
    elif value is _ABSENT:
        if name in vars(owner):
            delattr(owner, name)
    else:
        setattr(owner, name, value)


def _same(now: Any, ours: Any) -> bool:
    """A setting read back as a new object (``os.environ`` decodes each read) matches by
    equality."""
    if now is ours:
        return True
    plain = (str, bytes, int, float, bool, tuple, frozenset, type(None))
    return isinstance(ours, plain) and type(now) is type(ours) and now == ours


def describe(owner: Any) -> str:
    """``owner`` as a dotted name, for logs and :func:`installed`."""
    if owner is os.environ:
        return "os.environ"
    if isinstance(owner, dict):
        return str(owner.get("__name__", "<namespace>"))
    if isinstance(owner, type):
        return f"{owner.__module__}.{owner.__qualname__}"
    name = getattr(owner, "__name__", None)
    if isinstance(name, str) and type(owner).__name__ == "module":
        return name
    return f"<{type(owner).__qualname__} object>"


@dataclass(eq=False)
class Patch:
    """One replaced attribute: who replaced it, what stood there, what stands there now."""

    name: str
    by: str
    """The workaround (or tool) that made it: one patch per attribute per ``by``."""
    make: Callable[[Any], Any]
    """Builds the value from the original (called again when the stack below changes)."""
    where: str
    original: Any = None
    saved: Any = _ABSENT
    value: Any = None
    holders: list[Scope] = field(default_factory=list)
    """Restored when the last lets go."""
    key: tuple[int, str] = (0, "")
    owner: Any = field(default=None, repr=False)
    setting: bool = False
    """It may be set where nothing stood (an environment variable); restoring removes it again."""

    def restore(self) -> None:
        """Put back what this patch replaced, whoever holds it."""
        with _lock:
            _drop(self)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: where, by whom, held by which scopes."""
        return {"where": self.where, "by": self.by,
                "held_by": [scope.label for scope in self.holders]}


class Scope:
    """A holder of patches: a job's (released at its teardown), a test's, or :data:`PROCESS`."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.patches: list[Patch] = []

    def __repr__(self) -> str:
        return f"Scope({self.label!r}, {len(self.patches)} patches)"

    def __deepcopy__(self, memo: dict[int, Any]) -> Scope:
        # What holds a scope (a job) may be deep-copied with a model (a pipeline stage): the
        # copy holds the same patches.
        return self

    def patch(self, owner: Any, name: str, make: Callable[[Any], Any], *, by: str,
              refresh: bool = False, setting: bool = False) -> Patch:
        """Replace ``owner.name`` with ``make(original)``, held by this scope.

        Idempotent per ``(owner, name, by)`` (``refresh`` rebuilds from the original instead of
        wrapping the wrapper). AttributeError when ``owner`` has no ``name``."""
        with _lock:
            return _install(self, owner, name, make, by, refresh, setting)

    @contextlib.contextmanager
    def active(self) -> Iterator[Scope]:
        """Patches made inside the block without a scope are held by this one."""
        token = _current.set(self)
        try:
            yield self
        finally:
            _current.reset(token)

    def release(self) -> None:
        """Let go of every patch this scope holds; those no other scope holds are restored,
        latest first."""
        with _lock:
            for p in reversed(self.patches):
                if self in p.holders:
                    p.holders.remove(self)
                if not p.holders:
                    _remove(p)
            self.patches.clear()


PROCESS = Scope("process")
"""Holds patches made outside any job (tests, tools): released only by :func:`restore`."""

_current: contextvars.ContextVar[Scope] = contextvars.ContextVar("titan_rocm_patches",
                                                                 default=PROCESS)
_lock = threading.RLock()
_stacks: dict[tuple[int, str], list[Patch]] = {}
_order: list[Patch] = []


def current() -> Scope:
    """The scope a patch made now is held by."""
    return _current.get()


def patch(owner: Any, name: str, make: Callable[[Any], Any], *, by: str,
          refresh: bool = False) -> Patch:
    """:meth:`Scope.patch` in the :func:`current` scope."""
    return current().patch(owner, name, make, by=by, refresh=refresh)


def setting(owner: Any, name: str, value: Any, *, by: str) -> Patch:
    """Set ``owner.name`` (or ``owner[name]``) to ``value`` in the :func:`current` scope; set
    again by the same ``by``, it takes the new value (never a second layer). AttributeError
    for an unknown config option."""
    return current().patch(owner, name, lambda _before: value, by=by, refresh=True,
                           setting=True)


@contextlib.contextmanager
def scope(label: str = "scope") -> Iterator[Scope]:
    """A fresh :class:`Scope`, current inside the block and released at its end."""
    held = Scope(label)
    try:
        with held.active():
            yield held
    finally:
        held.release()


def installed(by: str | None = None) -> list[Patch]:
    """Every patch installed now (made by ``by``, if given), in the order they were made."""
    with _lock:
        return [p for p in _order if by in (None, p.by)]


def find(owner: Any, name: str, by: str) -> Patch | None:
    """``by``'s patch of ``owner.name``, if it is installed and still in place."""
    with _lock:
        stack = _live_stack(owner, name)
        return next((p for p in stack if p.by == by), None)


def original(owner: Any, name: str) -> Any:
    """``owner.name`` as it was before any titan-rocm patch (what stands there if none)."""
    with _lock:
        stack = _live_stack(owner, name)
        return stack[0].original if stack else _lookup(owner, name)


def restore(by: str | None = None) -> int:
    """Restore every patch (made by ``by``, if given), whoever holds it; returns how many."""
    with _lock:
        chosen = [p for p in _order if by in (None, p.by)]
        for p in reversed(chosen):
            _drop(p)
        return len(chosen)


# -- the registry (callers hold _lock) ---------------------------------------------------------

def _key(owner: Any, name: str) -> tuple[int, str]:
    return id(owner), name


def _live_stack(owner: Any, name: str) -> list[Patch]:
    """Forgotten first when someone replaced its top since."""
    key = _key(owner, name)
    stack = _stacks.get(key, [])
    if stack and not _same(_own(owner, name), stack[-1].value):
        _forget(key)
        return []
    return stack


def _forget(key: tuple[int, str]) -> None:
    for p in _stacks.pop(key, []):
        if p in _order:
            _order.remove(p)
        _unhold(p)


def _unhold(p: Patch) -> None:
    for holder in p.holders:
        if p in holder.patches:
            holder.patches.remove(p)
    p.holders.clear()


def _drop(p: Patch) -> None:
    _unhold(p)
    _remove(p)


def _hold(p: Patch, holder: Scope) -> Patch:
    if holder not in p.holders:
        p.holders.append(holder)
        holder.patches.append(p)
    return p


def _install(holder: Scope, owner: Any, name: str, make: Callable[[Any], Any], by: str,
             refresh: bool, setting: bool = False) -> Patch:
    stack = _live_stack(owner, name)
    for index, p in enumerate(stack):
        if p.by == by:
            if refresh:
                p.make = make
                _put(owner, name, p.saved)
                _rebuild(owner, name, stack[index:])
            return _hold(p, holder)
    key = _key(owner, name)
    p = Patch(name, by, make, f"{describe(owner)}.{name}", key=key, owner=owner,
              setting=setting)
    _rebuild(owner, name, [p])
    _stacks.setdefault(key, []).append(p)
    _order.append(p)
    return _hold(p, holder)


def _rebuild(owner: Any, name: str, patches: list[Patch]) -> None:
    for p in patches:
        try:
            p.original = _lookup(owner, name)
        except AttributeError:
            if not p.setting:
                raise
            p.original = _ABSENT  # set where nothing stood; _put refuses an unknown option
        p.saved = _own(owner, name)
        p.value = p.make(p.original)
        _put(owner, name, p.value)


def _remove(p: Patch) -> None:
    """Take ``p`` out of its stack: what it saved goes back, those above it are rebuilt."""
    if p in _order:
        _order.remove(p)
    owner, key = p.owner, p.key
    stack = _stacks.get(key, [])
    if p not in stack:
        return
    if not _same(_own(owner, p.name), stack[-1].value):  # replaced by someone else since
        _forget(key)
        return
    index = stack.index(p)
    _put(owner, p.name, p.saved)
    del stack[index]
    _rebuild(owner, p.name, stack[index:])
    if not stack:
        del _stacks[key]
