"""``@frozen``: kvplan's frozen dataclasses, for less at import time.

``dataclasses.dataclass(frozen=True)`` writes each class's methods as source and compiles them when the class
is defined (Python 3.11: one ``exec`` per method), and a ``kvplan estimate`` run defines ~40 such classes on
import: their ``__repr__``, ``__eq__`` and ``__hash__`` were ~8% of the run. :func:`frozen` lets dataclasses
make the rest (``__init__``, the frozen ``__setattr__`` / ``__delattr__``, ``__match_args__``, the fields) and
gives the class these three as closures over its fields that return what the generated ones return (Python
3.10 - 3.12's: the ``repr`` fields as ``Name(a=1, b='x')``, ``...`` for a repr that recurses; ``==`` on the tuples
of the ``compare`` fields of two objects of the same class, else ``NotImplemented``; the hash of the tuple of the
hashed fields). A class's own ``__repr__`` is kept (as dataclasses keeps it); a class that writes its own
``__eq__`` or ``__hash__`` is left to dataclasses whole.

May import: nothing in kvplan
"""

from __future__ import annotations

import dataclasses
from _thread import get_ident
from operator import attrgetter
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def frozen(cls: type[T]) -> type[T]:
    """``@dataclass(frozen=True)``, its ``__repr__``, ``__eq__`` and ``__hash__`` not compiled (see above)."""
    if "__eq__" in cls.__dict__ or "__hash__" in cls.__dict__:
        return dataclasses.dataclass(frozen=True)(cls)
    own_repr = "__repr__" in cls.__dict__  # kept, as dataclasses keeps it
    cls = dataclasses.dataclass(frozen=True, repr=False, eq=False)(cls)
    fields = dataclasses.fields(cls)
    compared = _tuple_of([f.name for f in fields if f.compare])
    hashed = _tuple_of([f.name for f in fields if (f.compare if f.hash is None else f.hash)])
    shown = [(f"{f.name}=", attrgetter(f.name)) for f in fields if f.repr]
    running: set[tuple[int, int]] = set()

    def __repr__(self: Any) -> str:
        key = id(self), get_ident()
        if key in running:  # dataclasses' guard against a repr that reaches itself
            return "..."
        running.add(key)
        try:
            return self.__class__.__qualname__ + "(" + ", ".join(label + repr(get(self)) for label, get in shown) + ")"
        finally:
            running.discard(key)

    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return compared(self) == compared(other)
        return NotImplemented

    def __hash__(self: Any) -> int:
        return hash(hashed(self))

    for fn in (__eq__, __hash__) if own_repr else (__repr__, __eq__, __hash__):
        fn.__qualname__ = f"{cls.__qualname__}.{fn.__name__}"
        setattr(cls, fn.__name__, fn)
    return cls


def _tuple_of(names: list[str]) -> Callable[[Any], tuple[Any, ...]]:
    """A function of an object: the tuple of its attributes ``names`` (an empty tuple for none)."""
    if not names:
        return lambda obj: ()
    if len(names) == 1:
        get = attrgetter(names[0])
        return lambda obj: (get(obj),)
    return attrgetter(*names)
