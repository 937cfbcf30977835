"""``@frozen`` (kvplan/frozen.py) makes the class ``@dataclass(frozen=True)`` makes: the same fields, __init__,
frozenness, repr, equality and hash, on classes with defaults, factories, fields left out of the repr, the
comparison or the hash, class variables, init-only variables, inheritance, no fields, a repr that recurses and
a repr of the class's own."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from kvplan.frozen import frozen


def _pair(body: dict, bases: tuple = ()) -> tuple[type, type]:
    """The class of ``body`` made by @frozen and by @dataclass(frozen=True)."""
    def make(decorate):  # noqa: ANN001, ANN202
        return decorate(type("Sample", bases, {"__qualname__": "Sample", "__module__": __name__, **body}))
    return make(frozen), make(dataclass(frozen=True))


def _hash(obj: object) -> object:
    try:
        return hash(obj)
    except TypeError as e:  # a list in a field: both raise it
        return str(e)


BODIES = {
    "plain": {"__annotations__": {"a": "int", "b": "str"}, "b": "x"},
    "factory": {"__annotations__": {"a": "int", "items": "list"}, "items": field(default_factory=list)},
    "left out": {"__annotations__": {"a": "int", "b": "int", "c": "int", "d": "int"},
                 "b": field(default=2, repr=False), "c": field(default=3, compare=False),
                 "d": field(default=4, hash=False)},
    "class var": {"__annotations__": {"a": "int", "K": "ClassVar[int]"}, "K": 7},
    "no fields": {"__annotations__": {}},
    "one field": {"__annotations__": {"a": "float"}},
}


@pytest.mark.parametrize("name", BODIES)
def test_the_same_class_as_dataclass_frozen(name):
    ours, theirs = _pair(dict(BODIES[name]))
    args = [(), (1,), (1, "y"), (2,)] if name != "no fields" else [()]
    for a in args:
        for b in args:
            try:
                x, y, x2, y2 = ours(*a), ours(*b), theirs(*a), theirs(*b)
            except TypeError:
                continue
            assert repr(x) == repr(x2) and (x == y) == (x2 == y2) and (x != y) == (x2 != y2)
            assert _hash(x) == _hash(x2)
            assert x.__eq__(object()) is NotImplemented and x2.__eq__(object()) is NotImplemented
            assert [f.name for f in dataclasses.fields(x)] == [f.name for f in dataclasses.fields(x2)]
            assert dataclasses.asdict(x) == dataclasses.asdict(x2) and ours.__match_args__ == theirs.__match_args__
            assert dataclasses.replace(x) == x and dataclasses.replace(x2) == x2
            for f in dataclasses.fields(x):
                with pytest.raises(dataclasses.FrozenInstanceError):
                    setattr(x, f.name, 0)
    assert ours.__repr__.__qualname__ == theirs.__repr__.__qualname__ == "Sample.__repr__"


def test_fields_left_out_of_the_comparison_and_the_hash_are_left_out():
    ours, theirs = _pair(dict(BODIES["left out"]))
    for cls in (ours, theirs):
        assert cls(1, c=9) == cls(1, c=0) and cls(1, b=9) != cls(1)
        assert hash(cls(1, d=9)) == hash(cls(1, d=0)) and cls(1, d=9) != cls(1, d=0)
        assert repr(cls(1, b=9)) == "Sample(a=1, c=3, d=4)"


def test_another_class_of_the_same_fields_is_not_equal_and_a_subclass_has_its_own_fields():
    ours, theirs = _pair(dict(BODIES["plain"]))
    assert ours(1) != theirs(1) and theirs(1) != ours(1)
    sub = frozen(type("Sub", (ours,), {"__qualname__": "Sub", "__annotations__": {"c": "int"}, "c": 0}))
    assert repr(sub(1, "y", 2)) == "Sub(a=1, b='y', c=2)" and sub(1) != ours(1) and sub(1, c=2) != sub(1, c=3)


def test_a_repr_that_reaches_itself_and_a_repr_of_its_own():
    ours, theirs = _pair(dict(BODIES["factory"]))
    x, x2 = ours(1), theirs(1)
    x.items.append(x)
    x2.items.append(x2)
    assert repr(x) == repr(x2) == "Sample(a=1, items=[...])"
    own, own2 = _pair({"__annotations__": {"a": "int"}, "__repr__": lambda self: "mine"})
    assert repr(own(1)) == repr(own2(1)) == "mine" and own(1) == own(1) and _hash(own(1)) == _hash(own2(1))


def test_a_class_with_its_own_equality_is_dataclasses_own():
    def eq(self, other):  # noqa: ANN001, ANN202
        return True

    ours, theirs = _pair({"__annotations__": {"a": "int"}, "__eq__": eq})
    assert ours(1) == ours(2) and hash(ours(1)) == hash(theirs(1)) and repr(ours(3)) == repr(theirs(3))
