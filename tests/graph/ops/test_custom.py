"""Custom kernels: registration, extension loading, dispatch, in-place mutation, errors."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from max.driver import Buffer
from max.dtype import DType
from max.engine import InferenceSession
from max.graph import BufferType, DeviceRef, Graph, KernelLibrary, TensorType, ops

CPU = DeviceRef.CPU()


@pytest.fixture
def kernel_file(tmp_path: Path) -> Path:
    p = tmp_path / "kern_test_mod.py"
    p.write_text(textwrap.dedent('''
        import torch
        from max.engine.custom import custom_op

        @custom_op("t_axpy")
        def axpy(x, y, *, a):
            return a * x + y

        @custom_op("t_two_out")
        def two(x):
            return x.sum(-1, keepdim=True), x.max(-1, keepdim=True).values

        @custom_op("t_bump", inplace=True)
        def bump(buf, *, by):
            buf.add_(by)

        @custom_op("t_wrong_dtype")
        def wrong(x):
            return x.to(torch.float64)
    '''))
    return p


def test_custom_op_from_py_extension(kernel_file):
    t = TensorType(DType.float32, (2, 3), CPU)
    with Graph("c", input_types=[t, t], custom_extensions=[kernel_file]) as g:
        x, y = g.inputs
        (z,) = ops.custom("t_axpy", CPU, [x, y], [t], parameters={"a": 3})
        s, m = ops.custom("t_two_out", CPU, [z], [TensorType(DType.float32, (2, 1), CPU)] * 2)
        g.output(z, s, m)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.ones((2, 3), np.float32)
    z, s, m = (o.to_numpy() for o in InferenceSession().load(g).execute(a, b))
    np.testing.assert_allclose(z, 3 * a + b)
    np.testing.assert_allclose(s, (3 * a + b).sum(-1, keepdims=True))
    np.testing.assert_allclose(m, (3 * a + b).max(-1, keepdims=True))
    lib = KernelLibrary(None, [kernel_file])
    assert "t_axpy" in lib and "t_bump" in list(lib)
    lib.verify_custom_op("t_axpy")


def test_inplace_custom_mutates_caller_buffer(kernel_file):
    with Graph("ic", input_types=[BufferType(DType.float32, (3,), CPU)]) as g:
        ops.inplace_custom("t_bump", CPU, [g.inputs[0]], parameters={"by": 2})
        ops.inplace_custom("t_bump", CPU, [g.inputs[0]], parameters={"by": 3})
        g.output()
    host = np.zeros(3, np.float32)
    InferenceSession(custom_extensions=[kernel_file]).load(g).execute(Buffer.from_numpy(host))
    np.testing.assert_array_equal(host, 5)


def test_unknown_custom_op_lists_registered_names(kernel_file):
    t = TensorType(DType.float32, (2,), CPU)
    with Graph("u", input_types=[t], custom_extensions=[kernel_file]) as g:
        with pytest.raises(ValueError, match="custom op 'nope' is not registered; registered custom kernels: .*'t_axpy'"):
            ops.custom("nope", CPU, [g.inputs[0]], [t])
    with Graph("u2", input_types=[t]) as g:  # no extensions on the graph: checked at load
        (r,) = ops.custom("nope2", CPU, [g.inputs[0]], [t])
        g.output(r)
    with pytest.raises(ValueError, match="custom op 'nope2' is not registered"):
        InferenceSession().load(g)


def test_output_dtype_checked_at_run_time(kernel_file):
    t = TensorType(DType.float32, (2,), CPU)
    with Graph("d", input_types=[t], custom_extensions=[kernel_file]) as g:
        (r,) = ops.custom("t_wrong_dtype", CPU, [g.inputs[0]], [t])
        g.output(r)
    with pytest.raises(RuntimeError, match="t_wrong_dtype.*output 0 has dtype torch.float64"):
        InferenceSession().load(g).execute(np.zeros(2, np.float32))


@pytest.mark.parametrize("path", ["ops.mojopkg", "kernel.mojo"])
def test_mojo_paths_explain_the_python_alternative(path):
    with pytest.raises(ValueError, match="libremax runs custom kernels written in Python, not Mojo.*custom_op"):
        InferenceSession(custom_extensions=[path]).load(Graph("m", lambda: None))


def test_bad_parameters():
    t = TensorType(DType.float32, (2,), CPU)
    with Graph("p", input_types=[t]) as g:
        with pytest.raises(TypeError, match="custom: parameter 'a' must be a bool, int, str or DType"):
            ops.custom("t_axpy", CPU, [g.inputs[0]], [t], parameters={"a": 1.5})


def test_example_program_runs():
    root = Path(__file__).resolve().parents[3]
    r = subprocess.run([sys.executable, str(root / "examples" / "04_custom_op.py")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "buffer after clamp_inplace" in r.stdout
