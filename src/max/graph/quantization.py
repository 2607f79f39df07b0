"""Quantization encodings, block parameters and quantization configs.

``QuantizationEncoding`` names how a weight's bytes encode its values.  Every
encoding is block based: ``elements_per_block`` values are stored together in
``block_size`` bytes.  A quantized weight is held as a ``uint8`` tensor of
shape ``(*rows, bytes_per_row)`` where
``bytes_per_row = row_length // elements_per_block * block_size``.

The reference defines ``Q4_0``, ``Q4_K``, ``Q5_K``, ``Q6_K`` and ``GPTQ``.
libremax extension: it also defines the other GGML kinds that real GGUF
checkpoints contain (``Q4_1``, ``Q5_0``, ``Q5_1``, ``Q8_0``, ``Q2_K``,
``Q3_K``), so a GGUF loader can hand every common tensor type to the graph
with its encoding.  The byte layouts are those of GGML (llama.cpp).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["BlockParameters", "QuantizationConfig", "QuantizationEncoding"]


@dataclass(frozen=True)
class BlockParameters:
    """How one quantization block is laid out: ``elements_per_block`` values in ``block_size`` bytes."""

    elements_per_block: int
    block_size: int


@dataclass
class QuantizationConfig:
    """Parameters of a GPTQ-style quantization (``quant_method``, ``bits``, ``group_size``, ...)."""

    quant_method: str
    bits: int
    group_size: int
    desc_act: bool = False
    sym: bool = False


class QuantizationEncoding(enum.Enum):
    """Quantization encodings supported by the graph (GGML block formats and GPTQ).

    ``Q4_0``, ``Q4_K``, ``Q5_K``, ``Q6_K`` and ``GPTQ`` are the reference's
    members; ``Q4_1``, ``Q5_0``, ``Q5_1``, ``Q8_0``, ``Q2_K`` and ``Q3_K`` are
    libremax extensions (GGML layouts, as found in GGUF files).
    """

    Q4_0 = "Q4_0"
    Q4_K = "Q4_K"
    Q5_K = "Q5_K"
    Q6_K = "Q6_K"
    GPTQ = "GPTQ"
    # libremax extensions: the other GGML block kinds.
    Q4_1 = "Q4_1"
    Q5_0 = "Q5_0"
    Q5_1 = "Q5_1"
    Q8_0 = "Q8_0"
    Q2_K = "Q2_K"
    Q3_K = "Q3_K"

    @property
    def block_parameters(self) -> BlockParameters:
        """The block layout of this encoding (GPTQ: 32 4-bit values in 16 bytes)."""
        return _BLOCK_PARAMETERS[self]

    @property
    def elements_per_block(self) -> int:
        """Number of tensor elements gathered into one block."""
        return _BLOCK_PARAMETERS[self].elements_per_block

    @property
    def block_size(self) -> int:
        """Number of bytes one encoded block occupies."""
        return _BLOCK_PARAMETERS[self].block_size

    @property
    def is_gguf(self) -> bool:
        """True for the GGML/GGUF block formats (everything but GPTQ)."""
        return self is not QuantizationEncoding.GPTQ

    @property
    def name(self) -> str:  # type: ignore[override]
        """The lowercase name (``"q4_k"``)."""
        return self._name_.lower()

    def __repr__(self) -> str:
        return f"QuantizationEncoding.{self._name_}"

    def __str__(self) -> str:
        return f"QuantizationEncoding.{self._name_}"


_QK_K = 256
_BLOCK_PARAMETERS: dict[QuantizationEncoding, BlockParameters] = {
    QuantizationEncoding.Q4_0: BlockParameters(32, 2 + 16),
    QuantizationEncoding.Q4_1: BlockParameters(32, 2 + 2 + 16),
    QuantizationEncoding.Q5_0: BlockParameters(32, 2 + 4 + 16),
    QuantizationEncoding.Q5_1: BlockParameters(32, 2 + 2 + 4 + 16),
    QuantizationEncoding.Q8_0: BlockParameters(32, 2 + 32),
    QuantizationEncoding.Q2_K: BlockParameters(_QK_K, _QK_K // 16 + _QK_K // 4 + 2 + 2),
    QuantizationEncoding.Q3_K: BlockParameters(_QK_K, _QK_K // 8 + _QK_K // 4 + 12 + 2),
    QuantizationEncoding.Q4_K: BlockParameters(_QK_K, 2 + 2 + 12 + _QK_K // 2),
    QuantizationEncoding.Q5_K: BlockParameters(_QK_K, 2 + 2 + 12 + _QK_K // 8 + _QK_K // 2),
    QuantizationEncoding.Q6_K: BlockParameters(_QK_K, _QK_K // 2 + _QK_K // 4 + _QK_K // 16 + 2),
    # GPTQ packs 4-bit values: 32 values in 16 bytes (scales/zeros live in separate tensors).
    QuantizationEncoding.GPTQ: BlockParameters(32, 16),
}
