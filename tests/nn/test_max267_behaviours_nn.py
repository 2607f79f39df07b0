"""MAX 26.7 behaviours of ``max.experimental.nn`` and legacy ``max.nn`` modules (B16 of
``../shared/max-behaviours.md``): each test names its fact."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from max import nn
from max.driver import CPU, Buffer
from max.dtype import DType
from max.experimental import nn as enn
from max.experimental.nn import Linear, Module, Sequential, module_dataclass
from max.experimental.tensor import Tensor
from max.graph import DeviceRef, Dim, Weight

F32 = DType.float32


# ----------------------------------------------------------------------------- B16.1 / B16.2 reprs
def test_B16_1_linear_repr_shows_bias_only_when_false():
    assert repr(Linear(2, 2)) == "Linear(in_dim=Dim(2), out_dim=Dim(2))"
    assert repr(Linear(1, 3, bias=False)) == "Linear(in_dim=Dim(1), out_dim=Dim(3), bias=False)"
    assert str(Linear(2, 2)) == repr(Linear(2, 2))


@module_dataclass
class Block(Module):
    a: int


@module_dataclass
class Wide(Module):
    first_field_name: int
    second_field_name: int
    third_field_name: int


def test_B16_2_one_line_when_it_fits():
    assert repr(Sequential(Block(a=1), Block(a=2))) == "Sequential(Block(a=1), Block(a=2))"
    assert repr(Block(a=7)) == "Block(a=7)"
    assert repr(Sequential()) == "Sequential()"


def test_B16_2_one_child_per_line_with_4_space_indent_recursively():
    w = Wide(1111111111, 2222222222, 3333333333)
    line = "Wide(first_field_name=1111111111, second_field_name=2222222222, third_field_name=3333333333)"
    assert len(line) > 80 and repr(w) == (
        "Wide(\n"
        "    first_field_name=1111111111,\n"
        "    second_field_name=2222222222,\n"
        "    third_field_name=3333333333\n"
        ")")
    seq = Sequential(Block(a=1), Sequential(Linear(3, 4, bias=False), Linear(Dim(4), Dim(2))))
    assert repr(seq) == (
        "Sequential(\n"
        "    Block(a=1),\n"
        "    Sequential(\n"
        "        Linear(in_dim=Dim(3), out_dim=Dim(4), bias=False),\n"
        "        Linear(in_dim=Dim(4), out_dim=Dim(2))\n"
        "    )\n"
        ")")
    assert "(0):" not in repr(seq)
    # the layout is rich's pretty_repr(obj, max_width=80, indent_size=4)
    from rich.pretty import pretty_repr

    for obj in (w, seq, Sequential(Block(a=1), Block(a=2))):
        assert repr(obj) == pretty_repr(obj, max_width=80, indent_size=4)


# ----------------------------------------------------------------------------- B16.3-B16.5 legacy max.nn
class Holder(nn.Module):
    def __init__(self, shape=(2, 3)) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 2, F32, DeviceRef.CPU())


def test_B16_3_legacy_state_dict_values_are_buffers():
    m = Holder()
    sd = m.state_dict()
    assert sorted(sd) == ["layer.weight"] and all(isinstance(v, Buffer) for v in sd.values())
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    m.load_state_dict({"layer.weight": w})
    got = m.state_dict()["layer.weight"]
    assert isinstance(got, Buffer) and got.dtype is F32 and got.shape == (2, 3)
    np.testing.assert_array_equal(got.to_numpy(), w)
    assert np.shares_memory(got.to_numpy(), w)  # no copy


def _unaligned_f32(shape):
    raw = np.zeros(int(np.prod(shape)) * 4 + 64, np.uint8)
    start = ((-raw.ctypes.data) % 16) + 2
    return np.ndarray(shape, np.float32, buffer=raw.data, offset=start)


def test_B16_4_unaligned_weight():
    m = Holder()
    bad = _unaligned_f32((2, 3))
    with pytest.raises(ValueError) as e:
        m.load_state_dict({"layer.weight": bad})
    text = str(e.value)
    assert text.startswith("Found unaligned weight 'layer.weight' (expected alignment=4).")
    assert text[len("Found unaligned weight 'layer.weight' (expected alignment=4)."):][0] != " "  # no space
    assert "safetensors" in text.lower()
    m.load_state_dict({"layer.weight": bad}, weight_alignment=1)
    np.testing.assert_array_equal(m.state_dict()["layer.weight"].to_numpy(), bad)


class Sym(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = Weight("weight", F32, (1024, "batch", 256), DeviceRef.CPU())


def test_B16_5_shape_mismatch_texts():
    m = Sym()
    with pytest.raises(ValueError, match=r"^Value provided to weight 'weight' had different shape \(dim\[0\]: "
                       r"expected 1024, got 512\)\."):
        m.load_state_dict({"weight": np.zeros((512, 32, 256), np.float32)})
    with pytest.raises(ValueError, match=r"^Value provided to weight 'weight' had different shape rank "
                       r"\(expected=3, actual=2\)\."):
        m.load_state_dict({"weight": np.zeros((1024, 32), np.float32)})
    with pytest.raises(ValueError, match=r"dim\[2\]: expected 256, got 255"):
        m.load_state_dict({"weight": np.zeros((1024, 2, 255), np.float32)})
    ok = np.ones((1024, 2, 256), np.float32)  # the symbolic dim takes any size
    m.load_state_dict({"weight": ok})
    assert m.state_dict()["weight"].shape == (1024, 2, 256)


# ----------------------------------------------------------------------------- B16.6 dir(Module)
def test_B16_6_module_namespace():
    names = set(dir(enn.Module))
    for n in ("load_state_dict", "parameters", "local_parameters", "children", "descendants", "to", "compile",
              "trace"):
        assert n in names, n
    for n in ("apply_to_local_parameters", "apply_to_parameters", "map_parameters", "load_state", "state_dict"):
        assert n not in names, n
    sig = inspect.signature(enn.Module.load_state_dict)
    assert list(sig.parameters) == ["self", "state", "strict", "auto_cast"]
    assert sig.parameters["strict"].default is True
    assert sig.parameters["auto_cast"].kind is inspect.Parameter.KEYWORD_ONLY
    assert sig.parameters["auto_cast"].default is False


def test_B16_6_load_state_dict_auto_cast():
    lin = Linear(2, 3, dtype=F32, device=CPU())
    w = np.arange(6, dtype=np.float64).reshape(3, 2)
    with pytest.raises(ValueError, match="dtype"):
        lin.load_state_dict({"weight": w}, strict=False)
    lin.load_state_dict({"weight": w}, strict=False, auto_cast=True)
    assert lin.weight.dtype is F32
    np.testing.assert_array_equal(lin.weight.to_numpy(), w.astype(np.float32))


def test_B16_6_trace_builds_a_graph_of_the_forward():
    from max.engine import InferenceSession
    from max.graph import Graph, TensorType

    lin = Linear(2, 3, dtype=F32, device=CPU())
    lin.load_state_dict({"weight": np.arange(6, dtype=np.float32).reshape(3, 2),
                         "bias": np.array([1, 2, 3], np.float32)})
    g = lin.trace(TensorType(F32, ["b", 2], DeviceRef.CPU()))
    assert isinstance(g, Graph) and sorted(g.weights()) == ["bias", "weight"]
    m = InferenceSession().load(g, weights_registry={n: t for n, t in lin.parameters})
    x = np.array([[1, 2], [3, 4]], np.float32)
    out = m.execute(Buffer.from_numpy(x))[0].to_numpy()
    np.testing.assert_allclose(out, x @ np.arange(6, dtype=np.float32).reshape(3, 2).T + [1, 2, 3])
    np.testing.assert_allclose(lin(Tensor(x)).to_numpy(), out)


def test_B16_3_state_dict_buffers_load_back_into_a_quantized_weight():
    """A quantized weight's state_dict() value is the raw Buffer of its blocks; loading it back (into
    the same or another module) keeps the weight's encoding."""
    from max.graph.quantization import QuantizationEncoding

    class Q(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = Weight("w", DType.uint8, (2, 36), DeviceRef.CPU(),
                            quantization_encoding=QuantizationEncoding.Q8_0)

    a, b = Q(), Q()
    blocks = np.arange(72, dtype=np.uint8).reshape(2, 36)
    from max.graph.weights import WeightData

    a.load_state_dict({"w": WeightData(blocks, "w", DType.uint8, [2, 36], QuantizationEncoding.Q8_0)})
    sd = a.state_dict()
    assert isinstance(sd["w"], Buffer)
    b.load_state_dict(sd)
    assert b.w.quantization_encoding is QuantizationEncoding.Q8_0
    np.testing.assert_array_equal(b.state_dict()["w"].to_numpy(), blocks)
