"""A model's parameters and gradients seen as PS blocks: views, never copies.

A block is a parameter or a range of its rows (``dtlaunch.ps.blocks``). The
client sends gradients straight from ``p.grad`` and copies pulled blocks
straight into ``p.data``; this module keeps those views and tells whether the
gradient last pushed is still the one in ``p.grad`` (a restarted server may need
it again).
"""

from __future__ import annotations

import weakref

import torch

from dtlaunch.errors import ConfigError
from dtlaunch.ps.blocks import Block, ParamSpec

__all__ = ["GradMark", "ModelTensors", "param_specs"]

GradMark = tuple[weakref.ref[torch.Tensor] | None, int]


class ModelTensors:
    """The parameters of ``model`` (contiguous, on the CPU) as block views.

    Raises (constructor):
        ConfigError: a parameter is not a contiguous CPU tensor, or there is none.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.specs = param_specs(model)
        self.params = [p for _, p in model.named_parameters()]
        self._zeros: dict[int, torch.Tensor] = {}

    def param_view(self, block: Block) -> torch.Tensor:
        """The block's slice of its parameter's data (writes reach the model)."""
        data = self.params[block.param].data
        return data if data.dim() == 0 else data[block.row_start : block.row_end]

    def grad_view(self, block: Block) -> torch.Tensor:
        """The block's slice of ``p.grad`` (zeros when the parameter has none)."""
        grad = self.params[block.param].grad
        if grad is None:
            return self.zero_grad(block)
        view = grad if grad.dim() == 0 else grad[block.row_start : block.row_end]
        return view if view.is_contiguous() else view.contiguous()

    def zero_grad(self, block: Block) -> torch.Tensor:
        """A zero gradient of the block's shape (one per block, reused)."""
        zero = self._zeros.get(block.block_id)
        if zero is None:
            zero = self._zeros[block.block_id] = torch.zeros(
                block.shape, dtype=self.params[block.param].dtype
            )
        return zero

    def grad_marks(self) -> list[GradMark]:
        """Which tensor each ``p.grad`` is now, and its in-place version counter."""
        return [_grad_mark(p) for p in self.params]

    def grads_unchanged(self, marks: list[GradMark]) -> bool:
        """Whether every ``p.grad`` is still the tensor ``marks`` saw, unchanged."""
        return len(marks) == len(self.params) and all(
            _grad_mark(p) == mark for p, mark in zip(self.params, marks, strict=True)
        )


def _grad_mark(param: torch.Tensor) -> GradMark:
    # A weak reference: a mark never keeps a gradient the user dropped alive.
    grad = param.grad
    if grad is None:
        return None, 0
    return weakref.ref(grad), int(getattr(grad, "_version", 0))


def param_specs(model: torch.nn.Module) -> list[ParamSpec]:
    """Name, shape and dtype of each parameter, in ``named_parameters`` order.

    Raises:
        ConfigError: a parameter is not a contiguous CPU tensor, or there is none.
    """
    specs = []
    for name, p in model.named_parameters():
        if p.device.type != "cpu" or not p.data.is_contiguous():
            raise ConfigError(
                f"parameter {name} is on {p.device} or not contiguous; the PS client "
                "needs contiguous CPU parameters (move the model with .cpu() first)"
            )
        specs.append(
            ParamSpec(
                name=name,
                shape=tuple(p.shape),
                dtype=str(p.dtype).removeprefix("torch."),
                itemsize=p.element_size(),
            )
        )
    if not specs:
        raise ConfigError("the model has no parameters to keep on parameter servers")
    return specs
