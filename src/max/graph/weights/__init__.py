"""Checkpoint loading: ``load_weights``, ``SafetensorWeights``, ``GGUFWeights``, ``PytorchWeights``.

Every loader memory-maps its files (nothing is copied until used), checks
each tensor's bytes against the file, and exposes the ``Weights`` protocol:
``weights.model.layers[0].mlp.weight.allocate(...)`` gives a graph
``Weight``; ``weights.allocated_weights`` is the ``weights_registry`` for
``InferenceSession.load``.
"""

from max.graph.weights.gguf import GGUFWeights
from max.graph.weights.load_weights import WeightsFormat, load_weights, weights_format
from max.graph.weights.protocol import TensorInfo, Weights
from max.graph.weights.pytorch import PytorchWeights, UnsafeCheckpointError
from max.graph.weights.safetensors import SafetensorWeights
from max.graph.weights.weight_data import WeightData

__all__ = [
    "GGUFWeights",
    "PytorchWeights",
    "SafetensorWeights",
    "TensorInfo",
    "UnsafeCheckpointError",
    "WeightData",
    "Weights",
    "WeightsFormat",
    "load_weights",
    "weights_format",
]
