"""Graph ops: each stages one node into ``Graph.current`` after checking its operands.

Every op is defined once, in the family module named below; its kernel lives
in ``max.engine.kernels.<family>``.
"""

from typing import Any

from max.graph.ops import _common
from max.graph.ops.constant import constant, constant_external
from max.graph.ops.elementwise import (
    abs,
    acos,
    add,
    atanh,
    cast,
    ceil,
    cos,
    div,
    equal,
    erf,
    exp,
    floor,
    floor_div,
    gelu,
    greater,
    greater_equal,
    is_inf,
    is_nan,
    log,
    log1p,
    logical_and,
    logical_not,
    logical_or,
    logical_xor,
    mod,
    mul,
    negate,
    not_equal,
    pow,
    relu,
    round,
    rsqrt,
    sigmoid,
    silu,
    sin,
    sqrt,
    sub,
    tanh,
    trunc,
    where,
)
from max.graph.ops.linalg import matmul, outer
from max.graph.ops.shape import reshape, shape_to_tensor
from max.graph.type import TensorType

try:  # families filled in progressively
    from max.graph.ops.reduction import *  # noqa: F401,F403
except ModuleNotFoundError:
    pass
try:
    from max.graph.ops.shape import *  # noqa: F401,F403
except ModuleNotFoundError:
    pass
try:
    from max.graph.ops.indexing import *  # noqa: F401,F403
except ModuleNotFoundError:
    pass
from max.graph.ops.norm import *  # noqa: F401,F403,E402
from max.graph.ops.creation import *  # noqa: F401,F403,E402
from max.graph.ops.device import *  # noqa: F401,F403,E402
from max.graph.ops.debug import *  # noqa: F401,F403,E402
from max.graph.ops.control_flow import call, cond, fence, while_loop  # noqa: E402
from max.graph.ops.buffer import buffer_create, buffer_load, buffer_store, buffer_store_slice  # noqa: E402
from max.graph.ops.custom import custom, inplace_custom  # noqa: E402
from max.graph.ops.conv import *  # noqa: F401,F403,E402
from max.graph.ops.pool import *  # noqa: F401,F403,E402
from max.graph.ops.signal import *  # noqa: F401,F403,E402
from max.graph.ops.recurrent import causal_conv1d, gated_delta_rule, selective_scan  # noqa: E402
from max.graph.ops.distributed import *  # noqa: F401,F403,E402
from max.graph.ops.complex import *  # noqa: F401,F403,E402
from max.graph.ops.vision import *  # noqa: F401,F403,E402
from max.graph.ops.quantized import dequantize, qmatmul  # noqa: E402
from max.graph.ops import random  # noqa: E402,F401  (max.graph.ops.random, reachable as an attribute)
