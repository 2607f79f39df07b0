"""``KVCacheParams`` and ``KVCacheStrategy``."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

from max.dtype import DType

DEFAULT_PAGE_SIZE = 128
"""Tokens per page when ``KVCacheParams.page_size`` is None (MAX's ``kv_cache_page_size`` default)."""

QUANTIZED_KV_DTYPES = (DType.int8, DType.float8_e4m3fn)
"""Cache dtypes stored as scaled 8-bit codes: each (token, KV head) row of ``head_dim`` codes is followed
by its float32 scale (4 bytes), so a pool row is ``head_dim + KV_SCALE_BYTES`` elements wide."""

KV_SCALE_BYTES = 4

KV_CACHE_DTYPES = {"int8": DType.int8, "fp8_e4m3": DType.float8_e4m3fn, "float32": DType.float32,
                   "bfloat16": DType.bfloat16, "float16": DType.float16}
"""Names accepted by ``--kv-cache-dtype`` (besides ``auto``: the model's float cache dtype)."""


class KVCacheStrategy(str, enum.Enum):
    """How the KV cache is laid out."""

    MODEL_DEFAULT = "model_default"
    """Let the architecture choose (resolved to a concrete strategy before use)."""
    PAGED = "paged"
    """Fixed-size pages in a pool plus a per-request page table."""

    def kernel_substring(self) -> str:
        """The substring used in kernel names for this strategy (``"paged"``)."""
        if self is KVCacheStrategy.MODEL_DEFAULT:
            raise ValueError("KVCacheStrategy.MODEL_DEFAULT must be resolved to a concrete strategy first")
        return self.value

    def uses_opaque(self) -> bool:
        """Whether kernels receive the cache as an opaque collection object (True for PAGED)."""
        return self is KVCacheStrategy.PAGED


_SHORTHAND = {
    DType.float32: "f32",
    DType.bfloat16: "bf16",
    DType.float16: "f16",
    DType.float64: "f64",
    DType.float8_e4m3fn: "f8e4m3fn",
    DType.float8_e4m3fnuz: "f8e4m3fnuz",
    DType.float8_e5m2: "f8e5m2",
    DType.float8_e5m2fnuz: "f8e5m2fnuz",
}


@dataclass
class KVCacheParams:
    """Shape and policy of a model's KV cache.

    ``n_kv_heads`` is the model's total; ``n_kv_heads_per_device`` is derived when left
    at 0: ``n_kv_heads // n_devices`` under tensor parallelism, or ``n_kv_heads`` when
    ``data_parallel_degree > 1`` (each replica keeps whole heads).  ``page_size`` None
    means :data:`DEFAULT_PAGE_SIZE`.  The number of layers is a property of the
    manager (``KVCacheManager(..., num_layers, ...)``), as in the reference.
    """

    dtype: DType
    n_kv_heads: int
    head_dim: int
    enable_prefix_caching: bool = False
    enable_kvcache_swapping_to_host: bool = False
    host_kvcache_swap_space_gb: Optional[float] = None
    cache_strategy: KVCacheStrategy = KVCacheStrategy.PAGED
    page_size: Optional[int] = None
    n_devices: int = 1
    data_parallel_degree: int = 1
    n_kv_heads_per_device: int = 0
    host_kvcache_spill_dir: Optional[str] = None
    """With ``enable_kvcache_swapping_to_host``: keep evicted prefix-cache pages as files in this directory
    (bounded by ``host_kvcache_swap_space_gb``) instead of host memory."""

    def __post_init__(self) -> None:
        if not isinstance(self.dtype, DType):
            raise TypeError(f"KVCacheParams: dtype must be a DType, got {self.dtype!r}")
        self.cache_strategy = KVCacheStrategy(self.cache_strategy)
        for name in ("n_kv_heads", "head_dim", "n_devices", "data_parallel_degree"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"KVCacheParams: {name} must be a positive int, got {v!r}")
        if self.page_size is not None and (
            isinstance(self.page_size, bool) or not isinstance(self.page_size, int) or self.page_size < 1
        ):
            raise ValueError(f"KVCacheParams: page_size must be None or a positive int, got {self.page_size!r}")
        if self.n_devices % self.data_parallel_degree:
            raise ValueError(
                f"KVCacheParams: n_devices ({self.n_devices}) must be divisible by data_parallel_degree "
                f"({self.data_parallel_degree})"
            )
        if self.n_kv_heads_per_device == 0:
            if self.data_parallel_degree > 1:
                tp = self.n_devices // self.data_parallel_degree
            else:
                tp = self.n_devices
            if self.n_kv_heads % tp:
                raise ValueError(
                    f"KVCacheParams: n_kv_heads ({self.n_kv_heads}) must be divisible by the tensor-parallel "
                    f"degree ({tp})"
                )
            self.n_kv_heads_per_device = self.n_kv_heads // tp
        elif self.n_kv_heads_per_device < 0:
            raise ValueError(f"KVCacheParams: n_kv_heads_per_device must be >= 0, got {self.n_kv_heads_per_device}")
        if self.enable_kvcache_swapping_to_host:
            if not self.enable_prefix_caching:
                raise ValueError("KVCacheParams: enable_kvcache_swapping_to_host requires enable_prefix_caching")
            if self.host_kvcache_swap_space_gb is None or self.host_kvcache_swap_space_gb <= 0:
                raise ValueError(
                    "KVCacheParams: enable_kvcache_swapping_to_host requires host_kvcache_swap_space_gb > 0"
                )
        elif self.host_kvcache_spill_dir is not None:
            raise ValueError("KVCacheParams: host_kvcache_spill_dir requires enable_kvcache_swapping_to_host")

    @property
    def dtype_shorthand(self) -> str:
        """Short text form of the dtype (``"bf16"``, ``"f32"``, ...)."""
        return _SHORTHAND.get(self.dtype, self.dtype.name)

    @property
    def static_cache_shape(self) -> tuple[str, str, str, str, str]:
        """Symbolic dimension names of a per-layer K or V cache."""
        return ("num_layers", "batch_size", "seq_len", "n_kv_heads", "head_dim")

    @property
    def effective_page_size(self) -> int:
        """``page_size``, or :data:`DEFAULT_PAGE_SIZE` when it is None."""
        return DEFAULT_PAGE_SIZE if self.page_size is None else self.page_size

    @property
    def tensor_parallel_degree(self) -> int:
        """Devices per data-parallel replica."""
        return self.n_devices // self.data_parallel_degree

    @property
    def is_quantized(self) -> bool:
        """Whether rows are stored as 8-bit codes with a per-(token, KV head) float32 scale
        (``dtype`` int8 or float8_e4m3fn; see :data:`QUANTIZED_KV_DTYPES`)."""
        return self.dtype in QUANTIZED_KV_DTYPES

    @property
    def row_width(self) -> int:
        """Elements of one (token, KV head) row in the pool: ``head_dim``, plus the 4 scale bytes of a
        quantised cache."""
        return self.head_dim + (KV_SCALE_BYTES if self.is_quantized else 0)

    def bytes_per_token(self, num_layers: int) -> int:
        """Bytes of K and V for one token on one device, across ``num_layers`` layers."""
        return 2 * num_layers * self.n_kv_heads_per_device * self.row_width * self.dtype.size_in_bytes

    def bytes_per_page(self, num_layers: int) -> int:
        """Bytes of one page (K and V, all layers) on one device."""
        return self.effective_page_size * self.bytes_per_token(num_layers)
