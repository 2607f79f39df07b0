"""``Shape``: a list of :class:`~max.graph.dim.Dim`."""

from __future__ import annotations

from typing import Any, Iterable, Sequence, TypeGuard, Union

from max.graph.dim import Dim, DimLike, StaticDim, SymbolicDim

ShapeLike = Union[Iterable[DimLike], "Shape"]


class Shape(list):
    """The dims of a tensor.  ``str`` prints ``[2, batch]``; compares equal to lists/tuples of DimLike."""

    def __init__(self, dims: ShapeLike = ()) -> None:
        if isinstance(dims, (str, bytes)) or not hasattr(dims, "__iter__"):
            raise TypeError(f"Shape: expected a sequence of dims, got {type(dims).__name__} {dims!r}")
        super().__init__(Dim(d) for d in dims)

    @property
    def rank(self) -> int:
        return len(self)

    @property
    def static_dims(self) -> list[int]:
        """The sizes of the static dims, in order."""
        return [d.dim for d in self if isinstance(d, StaticDim)]

    @staticmethod
    def is_static(shape: "Shape | Sequence[Any]") -> TypeGuard[list[StaticDim]]:
        return all(isinstance(Dim(d), StaticDim) for d in shape)

    @property
    def parameters(self) -> Iterable[SymbolicDim]:
        seen: dict = {}
        for d in self:
            for p in d.parameters:
                seen.setdefault(p.name, p)
        return list(seen.values())

    def evaluate(self, env: Any = {}) -> tuple[int, ...]:  # noqa: B006 - read-only
        """Concrete sizes given values for the symbolic names."""
        return tuple(d.evaluate(env) for d in self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple)):
            if len(other) != len(self):
                return False
            try:
                return all(a == Dim(b) for a, b in zip(self, other))
            except TypeError:
                return False
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        r = self.__eq__(other)
        return r if r is NotImplemented else not r

    __hash__ = None  # type: ignore[assignment]  # mutable, like list

    def __getitem__(self, idx):  # type: ignore[override]
        r = super().__getitem__(idx)
        return Shape(r) if isinstance(idx, slice) else r

    def __add__(self, other: Any) -> "Shape":  # type: ignore[override]
        return Shape(list(self) + [Dim(d) for d in other])

    def __radd__(self, other: Any) -> "Shape":
        return Shape([Dim(d) for d in other] + list(self))

    def __repr__(self) -> str:
        """MAX's form (``str`` is the same): ``[Dim(2), Dim('n')]``."""
        return "[" + ", ".join(repr(d) for d in self) + "]"

    __str__ = __repr__

    def _text(self) -> str:
        """The compact form of graph printouts: ``[2, n]``."""
        return "[" + ", ".join(str(d) for d in self) + "]"

    def to_mlir(self) -> str:
        return self._text()

    @classmethod
    def from_mlir(cls, attr: Any) -> "Shape":
        if isinstance(attr, str):
            inner = attr.strip().strip("[]").strip()
            return cls([Dim.from_mlir(p) for p in inner.split(",")] if inner else [])
        return cls(attr)
