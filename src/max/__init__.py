"""libremax: the MAX Python API (``max.graph``, ``max.engine``, ``max.driver`` ...) on PyTorch.

Import name ``max``; distribution ``libremax``.  Sub-packages are imported lazily
so ``import max.dtype`` does not pull in the graph compiler.
"""

__version__ = "0.1.0"
