"""The max.torch grayscale examples from the reference, as one runnable program.

Part 1 is the reference's ``graph_op`` example (grayscale.py), unchanged: a
MAX graph called from PyTorch in destination-passing style under
torch.compile.  Part 2 is its ``CustomOpLibrary`` example.  That one loads a
Mojo kernel library ("my_library/grayscale.mojo"); libremax runs Python
kernels instead, so here the kernel is a torch function registered with
``@custom_op("grayscale", inplace=True)`` in this file, and the library is this
module.  The kernel keeps the Mojo signature: output first, then the input.
"""

import sys

import numpy as np
import torch

import max.torch
from max.dtype import DType
from max.engine.custom import custom_op
from max.graph import ops
from max.torch import CustomOpLibrary

# ---------------------------------------------------------------- part 1: graph_op


@max.torch.graph_op
def max_grayscale(pic: max.graph.TensorValue):
    scaled = pic.cast(DType.float32) * np.array([0.21, 0.71, 0.07])
    grayscaled = ops.sum(scaled, axis=-1).cast(pic.dtype)
    # max reductions don't remove the dimension, need to squeeze
    return ops.squeeze(grayscaled, axis=-1)


@torch.compile
def grayscale(pic: torch.Tensor):
    output = pic.new_empty(pic.shape[:-1])  # Remove color channel dimension
    max_grayscale(output, pic)  # Call as destination-passing style
    return output


device = "cuda" if torch.cuda.is_available() else "cpu"
img = (torch.rand(64, 64, 3, device=device) * 255).to(torch.uint8)
result = grayscale(img)
print(f"Input shape: {img.shape}")
print(f"Output shape: {result.shape}")
print("Grayscale conversion completed successfully!")

weights = torch.tensor([0.21, 0.71, 0.07], dtype=torch.float64, device=device)
reference = (img.to(torch.float64) * weights).sum(-1).to(torch.uint8)
assert (result.int() - reference.int()).abs().max() <= 1, "graph_op grayscale differs from the torch reference"

# ---------------------------------------------------------------- part 2: CustomOpLibrary


# libremax adaptation: the reference's Mojo kernel (my_library/grayscale.mojo) becomes
# a Python kernel registered with @custom_op; in-place kernels receive the output
# buffer first, like the Mojo OutputTensor argument, and write into it.
@custom_op("grayscale", inplace=True)
def grayscale_kernel(img_out: torch.Tensor, img_in: torch.Tensor) -> None:
    w = torch.tensor([0.21, 0.71, 0.07], dtype=torch.float64, device=img_in.device)
    img_out.copy_((img_in.to(torch.float64) * w).sum(-1).to(img_out.dtype))


op_library = CustomOpLibrary(sys.modules[__name__])  # the reference passes "my_library"
grayscale_op = op_library.grayscale


def grayscale_lib(pic: torch.Tensor) -> torch.Tensor:
    result = pic.new_empty(pic.shape[:-1])
    grayscale_op(result, pic)
    return result


img = (torch.rand(64, 64, 3) * 255).to(torch.uint8)
result = grayscale_lib(img)
assert torch.equal(result, (img.to(torch.float64) * weights.cpu()).sum(-1).to(torch.uint8))
print(f"CustomOpLibrary grayscale: {tuple(img.shape)} -> {tuple(result.shape)}")
