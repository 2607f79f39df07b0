"""``batch_inplace_copy``: many ``dst.inplace_copy_from(src)`` copies as one call."""

from __future__ import annotations

from typing import Sequence

from max.driver.buffer import Buffer

__all__ = ["batch_inplace_copy"]


def batch_inplace_copy(dsts: Sequence[Buffer], srcs: Sequence[Buffer]) -> None:
    """Copy ``srcs[i]`` into ``dsts[i]`` for every ``i`` (devices may differ), as
    ``dsts[i].inplace_copy_from(srcs[i])`` does.

    Every pair is checked before anything is written (both buffers contiguous, the same number of
    bytes, a writable destination), so a bad pair leaves all destinations unchanged: ValueError
    (TypeError for non-Buffers or a single Buffer in place of a sequence).
    """
    for name, seq in (("dsts", dsts), ("srcs", srcs)):
        if isinstance(seq, Buffer) or not isinstance(seq, Sequence):
            raise TypeError(f"batch_inplace_copy: {name} must be a sequence of Buffers, got {type(seq).__name__}")
    if len(dsts) != len(srcs):
        raise ValueError(f"batch_inplace_copy: {len(dsts)} destinations for {len(srcs)} sources")
    for i, (d, s) in enumerate(zip(dsts, srcs)):
        if not isinstance(d, Buffer) or not isinstance(s, Buffer):
            raise TypeError(f"batch_inplace_copy: pair {i} is ({type(d).__name__}, {type(s).__name__}), "
                            "expected two Buffers")
        if d._ro:
            raise ValueError(f"batch_inplace_copy: destination {i} is read-only")
        if not d.is_contiguous or not s.is_contiguous:
            raise ValueError(f"batch_inplace_copy: pair {i}: both buffers must be contiguous")
        nd, ns = d.num_elements * d.element_size, s.num_elements * s.element_size
        if nd != ns:
            raise ValueError(f"batch_inplace_copy: pair {i}: sizes differ: source is {s.shape} {s.dtype} ({ns} "
                             f"bytes), destination is {d.shape} {d.dtype} ({nd} bytes)")
    for d, s in zip(dsts, srcs):
        d.inplace_copy_from(s)
