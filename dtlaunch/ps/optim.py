"""Server-side optimizers, with state kept per block.

SGD (momentum, dampening, Nesterov), Adagrad and Adam, written out with the
same operations in the same order as ``torch.optim`` (single-tensor path), so a
server's update equals what ``torch.optim`` computes on the same gradients. All
three are element-wise, so a block of rows is updated exactly as its rows would
be inside the whole tensor: per-block state is per-row state.

A block's state is a dict of tensors plus a step count, which is what a
snapshot stores and a migration carries to the block's next server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from dtlaunch.errors import ConfigError

__all__ = ["OPTIMIZERS", "BlockState", "OptimizerConfig", "apply_update", "new_state"]

OPTIMIZERS = ("sgd", "adagrad", "adam")


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizerConfig:
    """One optimizer and its hyper-parameters (``torch.optim`` defaults)."""

    name: str = "adam"
    lr: float = 1e-3
    momentum: float = 0.0  # sgd
    dampening: float = 0.0  # sgd
    nesterov: bool = False  # sgd
    beta1: float = 0.9  # adam
    beta2: float = 0.999  # adam
    eps: float = -1.0  # < 0: the optimizer's default (adam 1e-8, adagrad 1e-10)
    weight_decay: float = 0.0
    lr_decay: float = 0.0  # adagrad

    def validate(self) -> OptimizerConfig:
        """Raises: ConfigError naming the bad value."""
        if self.name not in OPTIMIZERS:
            raise ConfigError(
                f"optimizer {self.name!r} is not known; use one of {', '.join(OPTIMIZERS)}"
            )
        for label, value in (
            ("lr", self.lr),
            ("momentum", self.momentum),
            ("weight_decay", self.weight_decay),
            ("lr_decay", self.lr_decay),
        ):
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"optimizer {label} must be a finite number >= 0, got {value}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ConfigError(f"adam betas must be in [0, 1), got ({self.beta1}, {self.beta2})")
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ConfigError("nesterov momentum needs momentum > 0 and dampening = 0")
        return self

    @property
    def effective_eps(self) -> float:
        if self.eps >= 0:
            return self.eps
        return 1e-10 if self.name == "adagrad" else 1e-8


@dataclass(slots=True)
class BlockState:
    """A block's optimizer state: step count and named tensors."""

    step: int = 0
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


def new_state(config: OptimizerConfig, param: torch.Tensor) -> BlockState:
    """Fresh state for one block, as ``torch.optim`` makes it at its first step."""
    if config.name == "adam":
        return BlockState(
            tensors={
                "exp_avg": torch.zeros_like(param),
                "exp_avg_sq": torch.zeros_like(param),
            }
        )
    if config.name == "adagrad":
        return BlockState(tensors={"sum": torch.zeros_like(param)})
    return BlockState()  # sgd: the momentum buffer is made from the first gradient


def apply_update(
    config: OptimizerConfig, param: torch.Tensor, grad: torch.Tensor, state: BlockState
) -> None:
    """One optimizer step on ``param`` in place; ``grad`` is only read (it may be
    a received frame)."""
    with torch.no_grad():
        if config.name == "adam":
            _adam(config, param, grad, state)
        elif config.name == "adagrad":
            _adagrad(config, param, grad, state)
        else:
            _sgd(config, param, grad, state)


def _sgd(config: OptimizerConfig, param: torch.Tensor, grad: torch.Tensor, st: BlockState) -> None:
    if config.weight_decay != 0:
        grad = grad.add(param, alpha=config.weight_decay)
    if config.momentum != 0:
        buf = st.tensors.get("momentum_buffer")
        if buf is None:
            buf = torch.clone(grad).detach()
            st.tensors["momentum_buffer"] = buf
        else:
            buf.mul_(config.momentum).add_(grad, alpha=1 - config.dampening)
        grad = grad.add(buf, alpha=config.momentum) if config.nesterov else buf
    st.step += 1
    param.add_(grad, alpha=-config.lr)


def _adagrad(
    config: OptimizerConfig, param: torch.Tensor, grad: torch.Tensor, st: BlockState
) -> None:
    st.step += 1
    if config.weight_decay != 0:
        grad = grad.add(param, alpha=config.weight_decay)
    clr = config.lr / (1 + (st.step - 1) * config.lr_decay)
    state_sum = st.tensors["sum"]
    state_sum.addcmul_(grad, grad, value=1)
    std = state_sum.sqrt().add_(config.effective_eps)
    param.addcdiv_(grad, std, value=-clr)


def _adam(config: OptimizerConfig, param: torch.Tensor, grad: torch.Tensor, st: BlockState) -> None:
    st.step += 1
    if config.weight_decay != 0:
        grad = grad.add(param, alpha=config.weight_decay)
    exp_avg, exp_avg_sq = st.tensors["exp_avg"], st.tensors["exp_avg_sq"]
    beta1, beta2 = config.beta1, config.beta2
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias_correction1 = 1 - beta1**st.step
    bias_correction2 = 1 - beta2**st.step
    step_size = config.lr / bias_correction1
    denom = (exp_avg_sq.sqrt() / math.sqrt(bias_correction2)).add_(config.effective_eps)
    param.addcdiv_(exp_avg, denom, value=-step_size)
