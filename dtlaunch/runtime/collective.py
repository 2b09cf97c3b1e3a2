"""Gradient averaging for allreduce jobs whose workers have unequal batches.

After ADJUST_BS (or with a short last batch) workers train different numbers of
samples per step. A plain mean of their gradients would then overweight the
small batches; weighting each worker's mean gradient by its share of the step's
samples, ``n_i / sum(n)``, gives exactly the gradient of the whole global batch:
``sum_i (n_i / N) * (1 / n_i) * sum_{x in batch_i} g(x) = (1 / N) * sum_x g(x)``.
torch is an optional dependency; only torch helpers import this module.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


def allreduce_gradients(
    model: torch.nn.Module, samples: int, *, group: dist.ProcessGroup | None = None
) -> tuple[float, float]:
    """Replace every ``p.grad`` with the global-batch mean gradient; returns the
    seconds spent moving gradients (AntDT's T_m) and the seconds spent waiting
    for the other workers.

    Each worker's ``p.grad`` must be the mean over its own ``samples`` (the usual
    ``reduction="mean"`` loss). A parameter without a gradient on this worker
    counts as zeros, so every worker reduces the same tensors in the same order.

    The first collective (the samples count) is also where a fast worker waits
    for the slowest one; that wait is not this worker's communication cost, and
    counting it would make every worker of a synchronous step look equally slow
    to the Monitor. So the two are timed apart.

    A worker with no samples this step (an empty batch from ``bsp_batches``)
    contributes exact zeros: the mean loss of an empty batch is NaN, and NaN
    times a weight of 0 is still NaN, which would poison every worker's model.

    Raises:
        RuntimeError: ``torch.distributed`` is not initialised, naming what to call.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "job.allreduce_gradients() needs torch.distributed: call "
            "torch.distributed.init_process_group(backend='gloo') (or 'nccl') first; "
            "dtlaunch sets MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE for it"
        )
    arrived = time.monotonic()
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        elif samples <= 0:
            p.grad.zero_()  # not grad * 0: NaN * 0 is NaN
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0, 0.0
    total = torch.tensor([float(samples)], dtype=torch.float64)
    dist.all_reduce(total, group=group)
    start = time.monotonic()
    waited = start - arrived
    weight = samples / total.item() if total.item() > 0 else 0.0
    flat = torch.cat([g.reshape(-1) for g in grads]) * weight
    dist.all_reduce(flat, group=group)
    offset = 0
    for g in grads:
        count = g.numel()
        g.copy_(flat[offset : offset + count].view_as(g))
        offset += count
    return time.monotonic() - start, waited


def agree(done: bool, gen: int, *, group: dist.ProcessGroup | None = None) -> tuple[bool, int]:
    """One collective per BSP step: whether any worker is out of data, and the
    newest regroup generation that EVERY worker has heard of (see ``elastic``)."""
    value = torch.tensor([1 if done else 0, -gen], dtype=torch.int64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return bool(value[0].item()), int(-value[1].item())
