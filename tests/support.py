"""Helpers shared by graph/op/engine tests: build a graph, compile it, run it.

``run_graph(fn, input_types, *arrays)`` builds ``Graph("t", fn, input_types)``,
loads it in a session on the test device and returns numpy outputs.
``LIBREMAX_TEST_DEVICE=gpu`` moves inputs/graphs to the first accelerator.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import numpy as np

from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType

ON_GPU = os.environ.get("LIBREMAX_TEST_DEVICE", "cpu").lower() == "gpu"


def test_device_ref() -> DeviceRef:
    return DeviceRef.GPU() if ON_GPU else DeviceRef.CPU()


def session():
    from max import driver
    from max.engine import InferenceSession

    devs = [driver.CPU()] + ([driver.Accelerator()] if ON_GPU else [])
    return InferenceSession(devices=devs)


def tt(dtype: DType, shape: Sequence[Any]) -> TensorType:
    """A TensorType on the test device."""
    return TensorType(dtype, shape, test_device_ref())


def to_input(a: Any) -> Any:
    from max.driver import Buffer

    if isinstance(a, np.ndarray):
        b = Buffer.from_numpy(a if a.flags.c_contiguous else a.copy(order="C"))
        if ON_GPU:
            from max import driver

            b = b.to(driver.Accelerator())
        return b
    return a


def run_graph(fn: Callable[..., Any], input_types: Sequence[TensorType], *arrays: Any,
              weights: dict | None = None) -> list[np.ndarray]:
    g = Graph("test_graph", fn, input_types=input_types)
    model = session().load(g, weights_registry=weights)
    outs = model.execute(*[to_input(a) for a in arrays])
    return [o.to_numpy() for o in outs]


def run1(fn: Callable[..., Any], input_types: Sequence[TensorType], *arrays: Any, **kw: Any) -> np.ndarray:
    (out,) = run_graph(fn, input_types, *arrays, **kw)
    return out


def np_dtype(dt: DType) -> np.dtype:
    return dt.to_numpy()
