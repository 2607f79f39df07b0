"""Weight formats: the table of formats (``formats``), the encodings the graph names
(``encoding``: :class:`QuantizationEncoding`), and the reference quantise/dequantise
(``codec``), into which the engine registers its faster native versions.

``max.graph.quantization`` keeps the reference's names (``QuantizationEncoding``,
``QuantizationConfig``, ``BlockParameters``) at the package level.
"""

from max.graph.quantization.encoding import BlockParameters, QuantizationConfig, QuantizationEncoding

__all__ = ["BlockParameters", "QuantizationConfig", "QuantizationEncoding"]
