"""``max.torch``: MAX graphs and custom kernels as PyTorch custom ops.

* :func:`graph_op` turns a function of MAX graph values into a
  ``torch.library`` custom op in destination-passing style (outputs passed
  first, written in place), usable eagerly, in ``torch.nn.Module``s and under
  ``torch.compile`` (Inductor), on CPU and CUDA tensors.
* :class:`CustomOpLibrary` exposes custom kernels (libremax's Python kernel
  libraries) as ``library.<opname>`` callables taking torch tensors.
"""

from max.torch.graph_op import CacheInfo, graph_op
from max.torch.library import CustomOpLibrary

__all__ = ["CustomOpLibrary", "graph_op", "CacheInfo"]
