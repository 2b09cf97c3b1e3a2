"""Tensors to frames and back without copies, and PS records to and from the wire."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import zmq

from dtlaunch.errors import WireError
from dtlaunch.ps.optim import OptimizerConfig
from dtlaunch.ps.store import DTYPES
from dtlaunch.wire.messages import PsBlockSpec, PsOptimizer

__all__ = [
    "as_buffer",
    "block_spec",
    "optimizer_from_wire",
    "optimizer_to_wire",
    "tensor_from_frame",
]


def as_buffer(tensor: torch.Tensor) -> Any:
    """A byte view of a contiguous CPU tensor's memory (no copy), for a frame."""
    if not tensor.is_contiguous():
        raise ValueError("a tensor frame needs a contiguous tensor")
    return tensor.detach().reshape(-1).view(torch.uint8).numpy()


def tensor_from_frame(frame: zmq.Frame, spec: PsBlockSpec) -> torch.Tensor:
    """The frame's bytes as a tensor of ``spec`` (a view of the frame, not a copy).

    Raises:
        WireError: unknown dtype, or a frame whose size does not match ``spec``.
    """
    dtype = DTYPES.get(spec.dtype)
    if dtype is None:
        raise WireError(f"block {spec.block_id}: dtype {spec.dtype!r} is not supported")
    if any(d < 0 for d in spec.shape):
        raise WireError(f"block {spec.block_id}: negative dimension in {spec.shape}")
    itemsize = torch.empty((), dtype=dtype).element_size()
    expected = math.prod(spec.shape) * itemsize
    buf = frame.buffer
    if len(buf) != expected:
        raise WireError(
            f"block {spec.block_id}: frame of {len(buf)} bytes, {spec.shape} {spec.dtype} "
            f"needs {expected}"
        )
    if expected == 0:
        return torch.empty(spec.shape, dtype=dtype)
    return torch.frombuffer(buf, dtype=dtype).reshape(spec.shape)


def block_spec(block_id: int, tensor: torch.Tensor) -> PsBlockSpec:
    return PsBlockSpec(
        block_id=block_id, shape=list(tensor.shape), dtype=str(tensor.dtype).removeprefix("torch.")
    )


def optimizer_to_wire(config: OptimizerConfig) -> PsOptimizer:
    return PsOptimizer(**dataclasses.asdict(config))


def optimizer_from_wire(wire: PsOptimizer) -> OptimizerConfig:
    """Raises: ConfigError for bad values."""
    fields = {f.name: getattr(wire, f.name) for f in dataclasses.fields(wire)}
    return OptimizerConfig(**fields).validate()
