"""Quantization encodings, block parameters and quantization configs (derived from ``formats``).

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

from max.graph.quantization.formats import encoding_formats

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


class _Encoding(enum.Enum):
    """Quantization encodings supported by the graph (GGML block formats and GPTQ).

    ``Q4_0``, ``Q4_K``, ``Q5_K``, ``Q6_K`` and ``GPTQ`` are the reference's
    members; ``Q4_1``, ``Q5_0``, ``Q5_1``, ``Q8_0``, ``Q2_K`` and ``Q3_K`` are
    libremax extensions (GGML layouts, as found in GGUF files).

    Members: one per block row of :data:`~max.graph.quantization.formats.FORMATS`, (GGML blocks, then ``GPTQ``).
    """

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
        return self._name_ != "GPTQ"

    @property
    def name(self) -> str:  # type: ignore[override]
        """The lowercase name (``"q4_k"``)."""
        return self._name_.lower()

    def __repr__(self) -> str:
        return f"QuantizationEncoding.{self._name_}"

    def __str__(self) -> str:
        return f"QuantizationEncoding.{self._name_}"


QuantizationEncoding = _Encoding(  # type: ignore[call-overload]
    "QuantizationEncoding", [(f.name, f.name) for f in encoding_formats()],
    module=__name__, qualname="QuantizationEncoding")
QuantizationEncoding.__doc__ = _Encoding.__doc__

_BLOCK_PARAMETERS: dict = {QuantizationEncoding[f.name]: BlockParameters(f.elements_per_block, f.block_size)
                            for f in encoding_formats()}
