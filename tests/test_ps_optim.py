"""Server-side optimizers equal torch.optim on the same gradients, also block by block."""

from __future__ import annotations

import pytest
import torch

from dtlaunch.errors import ConfigError
from dtlaunch.ps.optim import OptimizerConfig, apply_update, new_state

CASES = [
    (OptimizerConfig(name="sgd", lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
    (
        OptimizerConfig(name="sgd", lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
    ),
    (
        OptimizerConfig(name="sgd", lr=0.05, momentum=0.9, nesterov=True),
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
    ),
    (
        OptimizerConfig(name="adagrad", lr=0.1, lr_decay=0.01, weight_decay=0.001),
        lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.01, weight_decay=0.001),
    ),
    (OptimizerConfig(name="adam", lr=1e-2), lambda p: torch.optim.Adam(p, lr=1e-2)),
    (
        OptimizerConfig(name="adam", lr=3e-3, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.1),
        lambda p: torch.optim.Adam(p, lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    ),
]


@pytest.mark.parametrize(("config", "make_torch"), CASES, ids=lambda c: getattr(c, "name", ""))
def test_matches_torch_optim_over_several_steps_also_per_block(config, make_torch):
    gen = torch.Generator().manual_seed(1)
    start = torch.randn(10, 7, generator=gen)
    reference = torch.nn.Parameter(start.clone())
    opt = make_torch([reference])
    # Two blocks of rows, as the PS holds a tensor cut along dim 0.
    blocks = [start[:4].clone(), start[4:].clone()]
    states = [new_state(config, b) for b in blocks]
    for _ in range(6):
        grad = torch.randn(10, 7, generator=gen)
        reference.grad = grad.clone()
        opt.step()
        for block, state, g in zip(blocks, states, (grad[:4], grad[4:]), strict=True):
            before = g.clone()
            apply_update(config, block, g, state)
            assert torch.equal(g, before)  # the received gradient frame is only read
    torch.testing.assert_close(torch.cat(blocks), reference.detach(), rtol=0, atol=1e-6)


def test_bad_optimizer_settings_are_config_errors():
    with pytest.raises(ConfigError, match="not known"):
        OptimizerConfig(name="lamb").validate()
    with pytest.raises(ConfigError, match="lr must be"):
        OptimizerConfig(name="sgd", lr=-1).validate()
    with pytest.raises(ConfigError, match="betas"):
        OptimizerConfig(name="adam", beta1=1.0).validate()
    with pytest.raises(ConfigError, match="nesterov"):
        OptimizerConfig(name="sgd", nesterov=True).validate()
