"""LoRA adapter request/response types."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional, Union


class LoRAOperation(str, enum.Enum):
    """Enum for different LoRA operations."""

    LIST = "list"
    LOAD = "load"
    UNLOAD = "unload"


class LoRAStatus(str, enum.Enum):
    """Enum for LoRA operation status."""

    SUCCESS = "success"
    LOAD_ERROR = "load_error"
    LOAD_INVALID_ADAPTER = "load_invalid_adapter"
    LOAD_INVALID_PATH = "load_invalid_path"
    LOAD_NAME_EXISTS = "load_name_exists"
    UNLOAD_ERROR = "unload_error"
    UNLOAD_NAME_NONEXISTENT = "unload_name_nonexistent"


class LoRAType(str, enum.Enum):
    """Enumeration for LoRA Types."""

    A = "lora_A"
    """The LoRA A matrix (high rank tensor to low rank tensor)."""
    B = "lora_B"
    """The LoRA B matrix (low rank tensor to high rank tensor)."""
    BIAS = "lora.bias"
    """The LoRA bias matrix (added to matrix B)."""


@dataclass
class LoRARequest:
    """Container for LoRA adapter requests.

    ``LOAD`` needs both ``lora_name`` and ``lora_path``; ``UNLOAD`` needs ``lora_name``.
    """

    operation: LoRAOperation
    lora_name: Optional[str] = None
    lora_path: Optional[str] = None

    def __post_init__(self) -> None:
        self.operation = LoRAOperation(self.operation)
        if self.operation is LoRAOperation.LOAD and (not self.lora_name or not self.lora_path):
            raise ValueError("LoRARequest: LOAD needs both lora_name and lora_path")
        if self.operation is LoRAOperation.UNLOAD and not self.lora_name:
            raise ValueError("LoRARequest: UNLOAD needs lora_name")


@dataclass
class LoRAResponse:
    """Response from LoRA operations."""

    status: LoRAStatus
    message: Union[str, list[str]]
