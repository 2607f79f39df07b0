"""libremax's MEF files: an optimised :class:`Program` written to disk and read back.

The file holds the program *after* the graph passes, fusion and native lowering (so the backend
policy's decisions are already written into its nodes), the policy it was made with, and the
weights it reads, by name only: weight values are bound from a ``weights_registry`` when the file is
loaded.  Graph constants (``ops.constant`` values) are part of the program and are stored.  The
torch.fx code is regenerated from the program at load (``lower``); no pass runs again.

Layout (no pickle: every value is a tagged JSON value, and decoding only builds libremax's own types)::

    LIBREMAX-MEF <format version>\\n
    <sha256 of the body, hex>\\n
    <body: UTF-8 JSON>

This is not Modular's MEF format; a file from MAX (or from another libremax format version) is
refused with :class:`MEFError`.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import hashlib
import importlib
import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from max.dtype import DType
from max.engine.compiler.program import PNode, Program
from max.graph.dim import AlgebraicDim, Dim, StaticDim, SymbolicDim
from max.graph.shape import Shape
from max.graph.type import BufferType, DeviceRef, TensorType, _ChainType, _OpaqueType

MAGIC = b"LIBREMAX-MEF"
VERSION = 1


class MEFError(ValueError):
    """A MEF file that cannot be used: not libremax's, another format version, corrupt, or made
    under another backend policy / compiler."""


# ------------------------------------------------------------------------------------ values
_MODE = threading.local()
_MODE.digest_arrays = False


def _enc(v: Any, where: str) -> Any:
    if isinstance(v, enum.Enum):  # before str/int: str- and int-valued enums keep their type
        return {"enum": _qualname(type(v), where), "v": _enc(v.value, where)}
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return {"f": repr(v)}  # exact, and inf/nan survive
    if v is Ellipsis:
        return {"ellipsis": 1}
    if isinstance(v, DType):
        return {"dtype": v.name}
    if isinstance(v, DeviceRef):
        return {"dev": [v.device_type.value, v.id]}
    if isinstance(v, StaticDim):
        return {"sdim": v.dim}
    if isinstance(v, SymbolicDim):
        return {"sym": v.name}
    if isinstance(v, AlgebraicDim):
        return {"adim": _enc(v._poly(), where)}
    if isinstance(v, Shape):
        return {"shape": [_enc(d, where) for d in v]}
    if isinstance(v, (TensorType, BufferType)):
        return {"ttype": "buffer" if isinstance(v, BufferType) else "tensor", "dtype": v.dtype.name,
                "shape": [_enc(d, where) for d in v.shape], "dev": _enc(v.device, where),
                "layout": _enc(v._layout, where)}
    if isinstance(v, _ChainType):
        return {"chain": 1}
    if isinstance(v, _OpaqueType):
        return {"opaque": v.name, "params": _enc(v.parameters, where)}
    if isinstance(v, np.ndarray):
        if v.dtype == object:
            raise MEFError(f"cannot export {where}: object arrays are not supported")
        a = np.ascontiguousarray(v)
        if getattr(_MODE, "digest_arrays", False):  # a key, not a file: the bytes' digest stands for them
            return {"ndd": a.dtype.str, "shape": list(a.shape),
                    "sum": hashlib.blake2b(a.tobytes(), digest_size=20).hexdigest()}
        return {"nd": a.dtype.str, "shape": list(a.shape), "b64": base64.b64encode(a.tobytes()).decode("ascii")}
    if isinstance(v, np.generic):
        return {"npv": v.dtype.str, "b64": base64.b64encode(np.asarray(v).tobytes()).decode("ascii")}
    if isinstance(v, tuple):
        return {"t": [_enc(x, where) for x in v]}
    if isinstance(v, list):
        return {"l": [_enc(x, where) for x in v]}
    if isinstance(v, dict):
        return {"d": [[_enc(k, where), _enc(x, where)] for k, x in v.items()]}
    if isinstance(v, slice):
        return {"slice": [_enc(v.start, where), _enc(v.stop, where), _enc(v.step, where)]}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        fields = {f.name: _enc(getattr(v, f.name), where) for f in dataclasses.fields(v) if f.init}
        return {"dc": _qualname(type(v), where), "fields": fields}
    try:
        import torch

        if isinstance(v, torch.dtype):
            return {"tdtype": str(v).removeprefix("torch.")}
        if isinstance(v, torch.device):
            return {"tdev": str(v)}
    except ImportError:  # pragma: no cover
        pass
    raise MEFError(f"cannot export {where}: a value of type {type(v).__module__}.{type(v).__qualname__} "
                   "has no MEF encoding")


def _qualname(cls: type, where: str) -> str:
    mod = cls.__module__
    if not (mod == "max" or mod.startswith("max.")):
        raise MEFError(f"cannot export {where}: {mod}.{cls.__qualname__} is not a libremax type")
    return f"{mod}:{cls.__qualname__}"


def _resolve(name: str) -> type:
    mod, _, qual = name.partition(":")
    if not (mod == "max" or mod.startswith("max.")):
        raise MEFError(f"corrupt MEF file: refers to type {name!r} outside libremax")
    try:
        obj: Any = importlib.import_module(mod)
        for part in qual.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        raise MEFError(f"MEF file refers to {name!r}, which this libremax does not define") from None
    if not isinstance(obj, type):
        raise MEFError(f"corrupt MEF file: {name!r} is not a type")
    return obj


def _dec(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, list):
        raise MEFError("corrupt MEF file: untagged list")
    if not isinstance(v, dict) or not v:
        raise MEFError(f"corrupt MEF file: unexpected value {v!r:.80}")
    tag = next(iter(v))
    if tag == "f":
        return float(v["f"])
    if tag == "ellipsis":
        return Ellipsis
    if tag == "dtype":
        return DType[v["dtype"]]
    if tag == "dev":
        return DeviceRef(v["dev"][0], v["dev"][1])
    if tag == "sdim":
        return StaticDim(v["sdim"])
    if tag == "sym":
        return SymbolicDim(v["sym"])
    if tag == "adim":
        return Dim._from_poly(_dec(v["adim"]))
    if tag == "shape":
        return Shape([_dec(d) for d in v["shape"]])
    if tag == "ttype":
        cls = BufferType if v["ttype"] == "buffer" else TensorType
        return cls(DType[v["dtype"]], [_dec(d) for d in v["shape"]], _dec(v["dev"]), _dec(v["layout"]))
    if tag == "chain":
        return _ChainType()
    if tag == "opaque":
        return _OpaqueType(v["opaque"], _dec(v["params"]))
    if tag == "nd":
        raw = base64.b64decode(v["b64"])
        return np.frombuffer(raw, dtype=np.dtype(v["nd"])).reshape(v["shape"]).copy()
    if tag == "npv":
        return np.frombuffer(base64.b64decode(v["b64"]), dtype=np.dtype(v["npv"]))[0]
    if tag == "enum":
        return _resolve(v["enum"])(_dec(v["v"]))
    if tag == "t":
        return tuple(_dec(x) for x in v["t"])
    if tag == "l":
        return [_dec(x) for x in v["l"]]
    if tag == "d":
        return {_dec(k): _dec(x) for k, x in v["d"]}
    if tag == "slice":
        return slice(*(_dec(x) for x in v["slice"]))
    if tag == "dc":
        cls = _resolve(v["dc"])
        if not dataclasses.is_dataclass(cls):
            raise MEFError(f"corrupt MEF file: {v['dc']!r} is not a dataclass")
        return cls(**{k: _dec(x) for k, x in v["fields"].items()})
    if tag in ("tdtype", "tdev"):
        import torch

        return getattr(torch, v["tdtype"]) if tag == "tdtype" else torch.device(v["tdev"])
    raise MEFError(f"corrupt MEF file: unknown value tag {tag!r}")


# ------------------------------------------------------------------------------------ programs
def _ids_of(prog: Program) -> set:
    ids = set(prog.input_ids) | set(prog.output_ids) | set(prog.free_ids)
    for n in prog.nodes:
        ids.update(n.inputs)
        ids.update(n.outs)
    return ids


def encode_program(prog: Program, locations: bool = True) -> dict:
    """``prog`` (and its regions) as a JSON-able dict (``locations``: with the nodes' source locations)."""
    nodes = []
    for n in prog.nodes:
        where = f"{n.op} (created at {n.loc})"
        if "_tensor" in n.attrs:
            raise MEFError(f"cannot export {where}: it holds a bound tensor (export before weights are bound)")
        nodes.append({"op": n.op, "in": list(n.inputs), "out": list(n.outs), "loc": n.loc if locations else "",
                      "fx": bool(n.side_effects), "attrs": _enc(n.attrs, where),
                      "types": [_enc(t, where) for t in n.types],
                      "regions": [encode_program(r, locations) for r in n.regions]})
    types = {str(i): _enc(prog.types[i], f"value {i}") for i in sorted(_ids_of(prog)) if i in prog.types}
    weights = {}
    for name, w in prog.weights.items():
        parent = getattr(w, "_shard_parent", None)
        entry: dict = {"type": _enc(getattr(w, "_type", None), f"weight {name!r}")}
        if parent is not None:
            p, idx, st = parent
            entry["shard_parent"] = [p.name, idx, st.axis, st.num_devices]
        weights[name] = entry
    return {"name": prog.name, "inputs": list(prog.input_ids),
            "input_types": [_enc(t, "graph input") for t in prog.input_types],
            "outputs": list(prog.output_ids),
            "output_types": [_enc(t, "graph output") for t in prog.output_types],
            "free": list(prog.free_ids), "types": types, "weights": weights, "nodes": nodes}


class _WeightRef:
    """A weight of a loaded program: its name and type (and, for a shard, its parent's name)."""

    __slots__ = ("name", "_type", "_shard_parent")

    def __init__(self, name: str, typ: Any, shard_parent: Any = None) -> None:
        self.name = name
        self._type = typ
        self._shard_parent = shard_parent

    @property
    def type(self) -> Any:
        return self._type

    @property
    def dtype(self) -> Any:
        return self._type.dtype

    @property
    def shape(self) -> Any:
        return self._type.shape

    def __repr__(self) -> str:
        return f"Weight({self.name!r}, {self._type})"


class _Strategy:
    __slots__ = ("axis", "num_devices")

    def __init__(self, axis: Any, num_devices: int) -> None:
        self.axis = axis
        self.num_devices = num_devices


def decode_program(d: dict) -> Program:
    try:
        types = {int(k): _dec(v) for k, v in d["types"].items()}
        nodes = [PNode(n["op"], tuple(n["in"]), _dec(n["attrs"]), tuple(_dec(t) for t in n["types"]),
                       tuple(n["out"]), n["loc"], bool(n["fx"]), tuple(decode_program(r) for r in n["regions"]))
                 for n in d["nodes"]]
        weights: dict = {}
        for name, e in d["weights"].items():
            sp = e.get("shard_parent")
            parent = None
            if sp is not None:
                parent = (_WeightRef(sp[0], None), sp[1], _Strategy(sp[2], sp[3]))
            weights[name] = _WeightRef(name, _dec(e["type"]), parent)
        return Program(name=d["name"], input_ids=tuple(d["inputs"]),
                       input_types=tuple(_dec(t) for t in d["input_types"]), nodes=nodes,
                       output_ids=tuple(d["outputs"]), output_types=tuple(_dec(t) for t in d["output_types"]),
                       types=types, weights=weights, free_ids=tuple(d["free"]))
    except MEFError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise MEFError(f"corrupt MEF file: malformed program ({type(e).__name__}: {e})") from None


def copy_program(prog: Program) -> Program:
    """A copy whose node lists (its own and its regions') can be rewritten without touching ``prog``
    (binding weights replaces nodes); attribute values are shared, never mutated."""
    nodes = [dataclasses.replace(n, regions=tuple(copy_program(r) for r in n.regions)) if n.regions else n
             for n in prog.nodes]
    return dataclasses.replace(prog, nodes=nodes)


# ------------------------------------------------------------------------------------ keys
_FINGERPRINT: list = []


def compiler_fingerprint() -> str:
    """A digest of the libremax version and the compiler's sources: a cached program made by
    another compiler is never reused."""
    if not _FINGERPRINT:
        here = Path(__file__).resolve().parent
        engine = here.parent
        h = hashlib.sha256(f"mef{VERSION}".encode())
        try:
            from importlib.metadata import version

            h.update(version("libremax").encode())
        except Exception:  # noqa: BLE001 - not installed as a distribution (source checkout)
            pass
        # the passes and their order (session.optimize_program), the kernel choices, this format
        for f in (*sorted(here.glob("*.py")), engine / "backend.py", engine / "native" / "cost.py",
                  engine / "session.py"):
            h.update(f.name.encode())
            h.update(f.read_bytes())
        _FINGERPRINT.append(h.hexdigest()[:32])
    return _FINGERPRINT[0]


def policy_dict(policy: Any) -> dict:
    return {k: _enc(v, "backend policy") for k, v in dataclasses.asdict(policy).items()}


def _canon_symbols(v: Any, names: dict, in_poly: bool = False) -> Any:
    """An encoded program with its symbolic dims renamed in order of first use (builders number
    their symbols per process, e.g. ``ragged_tokens_4``; the structure is what the key is about)."""
    if isinstance(v, dict):
        if len(v) == 1 and "sym" in v:
            return {"sym": names.setdefault(v["sym"], f"${len(names)}")}
        return {k: _canon_symbols(x, names, in_poly or k == "adim") for k, x in v.items()}
    if isinstance(v, list):
        return [_canon_symbols(x, names, in_poly) for x in v]
    if in_poly and isinstance(v, str) and v != "//":
        return names.setdefault(v, f"${len(names)}")
    return v


def graph_key(prog: Program, opt_level: int, policy: Any) -> str:
    """The structural hash of an unoptimised program (with the compiler and the policy; not the
    source locations of its nodes nor the names of its symbolic dims): the compile cache's file name."""
    _MODE.digest_arrays = True
    try:
        enc = encode_program(prog, locations=False)
    finally:
        _MODE.digest_arrays = False
    body = json.dumps({"p": _canon_symbols(enc, {}), "o": opt_level, "b": policy_dict(policy),
                       "c": compiler_fingerprint()}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


# ------------------------------------------------------------------------------------ files
def write(path: str | os.PathLike, prog: Program, *, opt_level: int, policy: Any, extensions: list,
          key: str | None = None) -> None:
    """Write the optimised ``prog`` (atomically: a reader never sees half a file)."""
    body = json.dumps({"format": "libremax-mef", "version": VERSION, "compiler": compiler_fingerprint(),
                       "opt_level": opt_level, "policy": policy_dict(policy), "key": key,
                       "custom_extensions": [str(e) for e in extensions],
                       "program": encode_program(prog)}, separators=(",", ":")).encode()
    data = MAGIC + b" " + str(VERSION).encode() + b"\n" + hashlib.sha256(body).hexdigest().encode() + b"\n" + body
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def is_mef(path: str | os.PathLike) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def read(path: str | os.PathLike, policy: Any) -> dict:
    """The header and program of a MEF file made by this format version under ``policy``."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise MEFError(f"cannot read MEF file {str(path)!r}: {e}") from None
    if not data.startswith(MAGIC + b" "):
        raise MEFError(f"{str(path)!r} is not a libremax MEF file (libremax reads only the files "
                       "CompiledModel.export_mef writes, not Modular's MEF format)")
    head, _, rest = data.partition(b"\n")
    digest, _, body = rest.partition(b"\n")
    try:
        version = int(head[len(MAGIC) + 1:])
    except ValueError:
        raise MEFError(f"corrupt MEF file {str(path)!r}: bad version field {head[:40]!r}") from None
    if version != VERSION:
        raise MEFError(f"MEF file {str(path)!r} has format version {version}; this libremax reads version "
                       f"{VERSION}: export it again with this libremax")
    if hashlib.sha256(body).hexdigest().encode() != digest:
        raise MEFError(f"corrupt MEF file {str(path)!r}: its checksum does not match its contents "
                       "(truncated or modified)")
    try:
        doc = json.loads(body)
    except ValueError as e:
        raise MEFError(f"corrupt MEF file {str(path)!r}: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != "libremax-mef" or doc.get("version") != VERSION:
        raise MEFError(f"corrupt MEF file {str(path)!r}: bad header")
    if doc.get("compiler") != compiler_fingerprint():
        raise MEFError(f"MEF file {str(path)!r} was made by another libremax compiler (another version or "
                       "modified sources); export it again with this libremax")
    want = policy_dict(policy)
    if doc.get("policy") != want:
        raise MEFError(f"MEF file {str(path)!r} was lowered under backend policy {_show(doc.get('policy'))}, "
                       f"but this session's policy is {_show(want)} (e.g. another native kernel variant); "
                       "its kernel choices do not apply here: compile the graph again")
    doc["program"] = decode_program(doc["program"])
    return doc


def _show(p: Any) -> str:
    if not isinstance(p, dict):
        return repr(p)
    return "{" + ", ".join(f"{k}={_dec(v)!r}" for k, v in p.items()) + "}"


def encode_value(v: Any) -> Any:
    """An attribute value as tagged JSON (MEFError when it has no encoding)."""
    return _enc(v, "attribute")
