"""Add a custom op written in Python, use it in a graph, and run it.

The kernel module (examples/custom_kernels/my_kernels.py) registers torch
functions with @custom_op; the graph names them with ops.custom /
ops.inplace_custom and lists the module in custom_extensions.
"""

from pathlib import Path

import numpy as np

from max.driver import Buffer
from max.dtype import DType
from max.engine import InferenceSession
from max.graph import BufferType, DeviceRef, Graph, TensorType, ops

KERNELS = Path(__file__).parent / "custom_kernels" / "my_kernels.py"
cpu = DeviceRef.CPU()

with Graph("custom_demo", input_types=[TensorType(DType.float32, (4,), cpu), BufferType(DType.float32, (4,), cpu)],
           custom_extensions=[KERNELS]) as g:
    x, buf = g.inputs
    (y,) = ops.custom("swish_scaled", cpu, [x], [x.type], parameters={"beta": 2})
    ops.inplace_custom("clamp_inplace", cpu, [buf], parameters={"limit": 1})
    g.output(y)

model = InferenceSession().load(g)
x = np.array([-2.0, -0.5, 0.5, 2.0], np.float32)
host = np.array([-3.0, 0.25, 0.75, 5.0], np.float32)
(y,) = model.execute(x, Buffer.from_numpy(host))
expect = x / (1 + np.exp(-2 * x))
assert np.allclose(y.to_numpy(), expect, atol=1e-6)
assert np.array_equal(host, [-1.0, 0.25, 0.75, 1.0])
print("swish_scaled:", y.to_numpy())
print("buffer after clamp_inplace:", host)
try:
    with Graph("mojo", input_types=[], custom_extensions=["kernels.mojopkg"]) as bad:
        ops.custom("x", cpu, [], [])
except ValueError as e:
    print("a .mojopkg path explains the Python alternative:", str(e)[:90], "...")
