"""Gradient averaging for allreduce jobs whose workers have unequal batches.

After ADJUST_BS (or with a short last batch) workers train different numbers of
samples per step. A plain mean of their gradients would then overweight the
small batches; weighting each worker's mean gradient by its share of the step's
samples, ``n_i / sum(n)``, gives exactly the gradient of the whole global batch:
``sum_i (n_i / N) * (1 / n_i) * sum_{x in batch_i} g(x) = (1 / N) * sum_x g(x)``.
torch is an optional dependency; only torch helpers import this module.

Also ``connect_store``: a TCPStore client whose connect is bounded.
"""

from __future__ import annotations

import datetime
import queue
import threading
import time

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import TCPStore

STORE_CONNECT_GRACE_S = 5.0  # beyond the store's timeout, before a connect is given up


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


def connect_store(addr: str, port: int, timeout: datetime.timedelta) -> TCPStore:
    """A client of the store at ``addr:port``, or TimeoutError after ``timeout``
    and a grace. TCPStore's own timeout was seen not to hold: after a supervisor
    crash a worker's connect blocked for minutes in native code, its group never
    formed and the job stalled. The connect runs on a thread of its own, left
    behind (a daemon) if it never returns."""
    answer: queue.Queue[TCPStore | BaseException] = queue.Queue(maxsize=1)

    def connect() -> None:
        try:
            answer.put(TCPStore(addr, port, None, False, timeout=timeout))
        except BaseException as err:  # handed to the caller
            answer.put(err)

    threading.Thread(target=connect, name="dtlaunch-rna-store", daemon=True).start()
    limit = timeout.total_seconds() + STORE_CONNECT_GRACE_S
    try:
        got = answer.get(timeout=limit)
    except queue.Empty:
        raise TimeoutError(
            f"the group's store at {addr}:{port} did not answer in {limit:.0f} s"
        ) from None
    if isinstance(got, BaseException):
        raise got
    return got
