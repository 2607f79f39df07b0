"""Python custom kernels used by the max.torch tests (loaded by path, as a kernel library)."""

import torch

from max.engine.custom import custom_op


@custom_op("torchtest_scale_shift")
def scale_shift(x: torch.Tensor, *, scale: int, shift: int = 1) -> torch.Tensor:
    """scale * x + shift (functional: returns its result)."""
    return x * scale + shift


@custom_op("torchtest_split_sum")
def split_sum(x: torch.Tensor, y: torch.Tensor) -> tuple:
    """Two results: x + y and the row sums of x * y."""
    return x + y, (x * y).sum(-1)


@custom_op("torchtest_grayscale", inplace=True)
def grayscale(img_out: torch.Tensor, img_in: torch.Tensor) -> None:
    """Destination-passing kernel with the Mojo example's signature: output first, written in place."""
    w = torch.tensor([0.21, 0.71, 0.07], dtype=torch.float64, device=img_in.device)
    img_out.copy_((img_in.to(torch.float64) * w).sum(-1).to(img_out.dtype))


@custom_op("torchtest_nonzero_count")
def nonzero_count(x: torch.Tensor) -> torch.Tensor:
    """Needs data (not runnable on meta tensors): the output check happens after running."""
    n = int((x != 0).sum().item())
    return torch.full((n,), 7.0, dtype=x.dtype, device=x.device)
