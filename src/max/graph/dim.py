"""Tensor dimensions: static sizes, named symbolic sizes and algebraic expressions.

``Dim(value)`` converts: an int gives a :class:`StaticDim`, a str a
:class:`SymbolicDim`, and arithmetic on symbolic dims an :class:`AlgebraicDim`
kept in a canonical form (a polynomial with integer coefficients over symbol
names and opaque floor-division atoms), so equal expressions compare equal::

    >>> Dim("batch") * 5
    Dim('batch * 5')
    >>> -Dim("x") - 4 == -(Dim("x") + 4)
    True

Static-only arithmetic folds to a :class:`StaticDim`.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Union

import numpy as np

DimLike = Union[int, str, "Dim", np.integer]

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:]*$")

# A polynomial: {monomial: coefficient}; a monomial is a sorted tuple of
# (atom, power) pairs, an atom is a symbol name (str) or a floor-division
# atom ("//", numerator_poly_key, denominator_poly_key).  The empty monomial
# () is the constant term.
_Poly = dict


def _poly_key(p: _Poly) -> tuple:
    return tuple(sorted(((m, c) for m, c in p.items() if c != 0), key=lambda mc: _mono_sort_key(mc[0])))


def _atom_sort_key(atom: Any) -> tuple:
    if isinstance(atom, str):
        return (0, atom)
    return (1, repr(atom))


def _mono_sort_key(mono: tuple) -> tuple:
    degree = sum(p for _, p in mono)
    return (-degree, [(_atom_sort_key(a), -p) for a, p in mono])


def _mono_mul(a: tuple, b: tuple) -> tuple:
    powers: dict = {}
    for atom, p in a + b:
        powers[atom] = powers.get(atom, 0) + p
    return tuple(sorted(powers.items(), key=lambda ap: _atom_sort_key(ap[0])))


def _padd(a: _Poly, b: _Poly, sign: int = 1) -> _Poly:
    out = dict(a)
    for m, c in b.items():
        out[m] = out.get(m, 0) + sign * c
        if out[m] == 0:
            del out[m]
    return out


def _pmul(a: _Poly, b: _Poly) -> _Poly:
    out: dict = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            m = _mono_mul(ma, mb)
            out[m] = out.get(m, 0) + ca * cb
            if out[m] == 0:
                del out[m]
    return out


def _pconst(p: _Poly) -> int | None:
    """The constant value of ``p`` when it has no symbolic terms."""
    if not p:
        return 0
    if len(p) == 1 and () in p:
        return p[()]
    return None


class Dim:
    """A tensor dimension: static, symbolic, or algebraic.

    ``Dim(3)`` is a :class:`StaticDim`, ``Dim("batch")`` a :class:`SymbolicDim`.
    """

    __slots__ = ()

    def __deepcopy__(self, memo: dict) -> "Any":
        return self  # immutable

    def __copy__(self) -> "Any":
        return self

    def __new__(cls, value: DimLike = None):  # type: ignore[misc]
        if cls is Dim:
            if isinstance(value, Dim):
                return value
            if isinstance(value, (bool, np.bool_)):
                raise TypeError(f"Dim: expected an int, str or Dim, got bool {value!r}")
            if isinstance(value, (int, np.integer)):
                return StaticDim(int(value))
            if isinstance(value, str):
                return SymbolicDim(value)
            raise TypeError(
                f"Dim: expected an int, str or Dim, got {type(value).__name__} {value!r}"
            )
        return object.__new__(cls)

    # -- polynomial view -------------------------------------------------
    def _poly(self) -> _Poly:  # pragma: no cover - overridden
        raise NotImplementedError

    @staticmethod
    def _from_poly(p: _Poly) -> "Dim":
        c = _pconst(p)
        if c is not None:
            return StaticDim(c)
        if len(p) == 1:
            ((mono, coef),) = p.items()
            if coef == 1 and len(mono) == 1 and mono[0][1] == 1 and isinstance(mono[0][0], str):
                return SymbolicDim(mono[0][0])
        return AlgebraicDim._make(p)

    # -- arithmetic ------------------------------------------------------
    def __add__(self, other: DimLike) -> "Dim":
        return Dim._from_poly(_padd(self._poly(), _as_dim(other)._poly()))

    def __radd__(self, other: DimLike) -> "Dim":
        return _as_dim(other) + self

    def __sub__(self, other: DimLike) -> "Dim":
        return Dim._from_poly(_padd(self._poly(), _as_dim(other)._poly(), -1))

    def __rsub__(self, other: DimLike) -> "Dim":
        return _as_dim(other) - self

    def __mul__(self, other: DimLike) -> "Dim":
        return Dim._from_poly(_pmul(self._poly(), _as_dim(other)._poly()))

    def __rmul__(self, other: DimLike) -> "Dim":
        return _as_dim(other) * self

    def __neg__(self) -> "Dim":
        return Dim._from_poly({m: -c for m, c in self._poly().items()})

    def __floordiv__(self, other: DimLike) -> "Dim":
        num, den = self._poly(), _as_dim(other)._poly()
        dc = _pconst(den)
        if dc == 0:
            raise ZeroDivisionError(f"Dim: division of {self} by zero")
        nc = _pconst(num)
        if nc is not None and dc is not None:
            return StaticDim(nc // dc)
        if dc is not None and all(c % dc == 0 for c in num.values()):
            return Dim._from_poly({m: c // dc for m, c in num.items()})
        if num == den:
            return StaticDim(1)
        atom = ("//", _poly_key(num), _poly_key(den))
        return Dim._from_poly({((atom, 1),): 1})

    def __rfloordiv__(self, other: DimLike) -> "Dim":
        return _as_dim(other) // self

    def __truediv__(self, other: DimLike) -> "Dim":
        """Exact division (the result must be a whole dim)."""
        return self // other

    def __rtruediv__(self, other: DimLike) -> "Dim":
        return _as_dim(other) // self

    # -- comparison ------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if isinstance(other, (bool, np.bool_)):
            return NotImplemented
        if isinstance(other, (Dim, int, str, np.integer)):
            try:
                return _poly_key(self._poly()) == _poly_key(_as_dim(other)._poly())
            except (TypeError, ValueError):
                return False
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        r = self.__eq__(other)
        return r if r is NotImplemented else not r

    def __hash__(self) -> int:
        return hash(_poly_key(self._poly()))

    def __int__(self) -> int:
        """Static dims convert; any other is MAX's TypeError."""
        raise TypeError(f"int({self!r}): Int conversions only supported for static dims")

    # -- misc ------------------------------------------------------------
    @property
    def parameters(self) -> Iterable["SymbolicDim"]:
        """The symbolic dims this dim depends on."""
        names: list[str] = []
        _collect_names(self._poly(), names)
        return [SymbolicDim(n) for n in dict.fromkeys(names)]

    def evaluate(self, env: Mapping[str, int]) -> int:
        """The concrete size given values for the symbolic names (KeyError names a missing one)."""
        return _peval(self._poly(), env)

    def to_mlir(self) -> str:
        """A textual form of the dim (there is no MLIR here; kept for API compatibility)."""
        return str(self)

    @staticmethod
    def from_mlir(attr: Any) -> "Dim":
        """Parse what :meth:`to_mlir` returned for a static or symbolic dim."""
        if isinstance(attr, Dim):
            return attr
        s = str(attr).strip()
        if re.fullmatch(r"-?\d+", s):
            return StaticDim(int(s))
        if _NAME_RE.match(s):
            return SymbolicDim(s)
        raise ValueError(f"Dim.from_mlir: cannot parse {attr!r}")


def _collect_names(p: _Poly, out: list) -> None:
    for mono in p:
        for atom, _ in mono:
            if isinstance(atom, str):
                out.append(atom)
            else:
                _collect_names(dict(atom[1]), out)
                _collect_names(dict(atom[2]), out)


def _peval(p: _Poly, env: Mapping[str, int]) -> int:
    total = 0
    for mono, coef in p.items():
        v = coef
        for atom, power in mono:
            if isinstance(atom, str):
                try:
                    a = env[atom]
                except KeyError:
                    raise KeyError(f"symbolic dim {atom!r} has no value here") from None
            else:
                a = _peval(dict(atom[1]), env) // _peval(dict(atom[2]), env)
            v *= a**power
        total += v
    return total


def _as_dim(x: Any) -> Dim:
    if isinstance(x, Dim):
        return x
    return Dim(x)


class StaticDim(Dim):
    """A dimension of known size.  Compares equal to the int it holds."""

    __slots__ = ("dim",)

    def __init__(self, dim: int | Any) -> None:
        if isinstance(dim, StaticDim):
            dim = dim.dim
        if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, (int, np.integer)):
            raise TypeError(f"StaticDim: expected an int, got {type(dim).__name__} {dim!r}")
        dim = int(dim)
        if not -(2**63) <= dim < 2**63:
            raise ValueError(f"Dim value must be -2**63 <= dim < 2**63, got {dim}")
        object.__setattr__(self, "dim", dim)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("dims are immutable")

    def _poly(self) -> _Poly:
        return {(): self.dim} if self.dim else {}

    def __int__(self) -> int:
        return self.dim

    __index__ = __int__

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StaticDim):
            return self.dim == other.dim
        if isinstance(other, (int, np.integer)) and not isinstance(other, (bool, np.bool_)):
            return self.dim == int(other)
        return super().__eq__(other)

    def __hash__(self) -> int:
        return hash(self.dim)

    def __lt__(self, other: Any) -> bool:
        return self.dim < int(other)

    def __le__(self, other: Any) -> bool:
        return self.dim <= int(other)

    def __gt__(self, other: Any) -> bool:
        return self.dim > int(other)

    def __ge__(self, other: Any) -> bool:
        return self.dim >= int(other)

    def __repr__(self) -> str:
        return f"Dim({self.dim})"

    def __str__(self) -> str:
        return str(self.dim)

    @property
    def parameters(self) -> Iterable["SymbolicDim"]:
        return []

    def evaluate(self, env: Mapping[str, int] = {}) -> int:  # noqa: B006 - read-only
        return self.dim


class SymbolicDim(Dim):
    """A named dimension of unknown size.  Equal names mean equal sizes."""

    __slots__ = ("name",)

    def __init__(self, name: str | Any) -> None:
        if isinstance(name, SymbolicDim):
            name = name.name
        if not isinstance(name, str):
            raise TypeError(f"SymbolicDim: expected a str name, got {type(name).__name__} {name!r}")
        if not _NAME_RE.match(name):
            raise ValueError(
                f"Invalid name for symbolic dimension: {name!r} (letters, digits and _ . :, "
                "starting with a letter or _)"
            )
        object.__setattr__(self, "name", name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("dims are immutable")

    def _poly(self) -> _Poly:
        return {((self.name, 1),): 1}

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SymbolicDim):
            return self.name == other.name
        if isinstance(other, str):
            return self.name == other
        return super().__eq__(other)

    def __hash__(self) -> int:
        return super().__hash__()

    def __repr__(self) -> str:
        return f"Dim({self.name!r})"

    def __str__(self) -> str:
        return self.name


class AlgebraicDim(Dim):
    """An expression over symbolic dims, kept in canonical (polynomial) form."""

    __slots__ = ("_p",)

    def __init__(self, value: Any) -> None:
        if isinstance(value, Dim):
            p = value._poly()
        else:
            p = Dim(value)._poly()
        object.__setattr__(self, "_p", dict(p))

    @classmethod
    def _make(cls, p: _Poly) -> "AlgebraicDim":
        self = object.__new__(cls)
        object.__setattr__(self, "_p", p)
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("dims are immutable")

    def _poly(self) -> _Poly:
        return self._p

    @classmethod
    def apply(cls, op: Any, *operands: DimLike) -> Dim:
        """Apply an operator (``"add"``, ``"mul"``, ``"floordiv"``, ``"sub"``, ``"neg"`` or a callable)."""
        dims = [_as_dim(o) for o in operands]
        table = {
            "add": lambda a, b: a + b,
            "sub": lambda a, b: a - b,
            "mul": lambda a, b: a * b,
            "floordiv": lambda a, b: a // b,
            "div": lambda a, b: a // b,
            "neg": lambda a: -a,
        }
        fn = op if callable(op) else table.get(str(op).lower())
        if fn is None:
            raise ValueError(f"AlgebraicDim.apply: unknown operator {op!r}; known: {sorted(table)}")
        return fn(*dims)

    @property
    def attr(self) -> str:
        return str(self)

    def __repr__(self) -> str:
        return f"Dim({str(self)!r})"

    def __str__(self) -> str:
        return _format_poly(self._p)


def _format_atom(atom: Any) -> str:
    if isinstance(atom, str):
        return atom
    num = _format_poly(dict(atom[1]))
    den = _format_poly(dict(atom[2]))
    if len(atom[1]) > 1 or (atom[1] and atom[1][0][1] != 1 and atom[1][0][0]):
        num = f"({num})"
    if len(atom[2]) > 1 or " " in den:  # "12 // (kh * kw)", never the ambiguous "12 // kh * kw"
        den = f"({den})"
    return f"{num} // {den}"


def _format_mono(mono: tuple) -> str:
    parts = []
    for atom, power in mono:
        text = _format_atom(atom)
        parts.extend([text] * power)
    # a quotient after another factor reads left to right ("b * a // c" is (b * a) // c): bracket it
    return " * ".join(p if i == 0 or " // " not in p else f"({p})" for i, p in enumerate(parts))


def _format_poly(p: _Poly) -> str:
    if not p:
        return "0"
    items = sorted(p.items(), key=lambda mc: (mc[0] == (),) + _mono_sort_key(mc[0]))
    out = ""
    for i, (mono, coef) in enumerate(items):
        neg = coef < 0
        mag = -coef if neg else coef
        if mono == ():
            body = str(mag)
        elif mag == 1:
            body = _format_mono(mono)
        else:
            body = f"{_format_mono(mono)} * {mag}"
        if i == 0:
            out = f"-{body}" if neg else body
        else:
            out += f" - {body}" if neg else f" + {body}"
    return out


def solve_linear(dim: Dim, env: Mapping[str, int], value: int) -> tuple[str, int] | None:
    """Solve ``dim == value`` for its one unknown symbol when ``dim`` is linear in it.

    Returns ``(name, size)`` or None when there is no single linear unknown or no whole solution
    (e.g. ``h * 2 == 8`` gives ``("h", 4)``).
    """
    p = dim._poly()
    unknown = {a for mono in p for a, _ in mono if isinstance(a, str) and a not in env}
    if len(unknown) != 1:
        return None
    (name,) = unknown
    coef = 0
    rest = 0
    for mono, c in p.items():
        powers = dict(mono)
        k = powers.get(name, 0)
        if k > 1 or any(not isinstance(a, str) and name in str(a) for a in powers):
            return None
        others = {a: pw for a, pw in powers.items() if a != name}
        try:
            v = c * _peval({tuple(others.items()): 1}, env) if others else c
        except KeyError:
            return None
        if k == 1:
            coef += v
        else:
            rest += v
    if coef == 0 or (value - rest) % coef:
        return None
    sol = (value - rest) // coef
    return (name, sol) if sol >= 0 else None
