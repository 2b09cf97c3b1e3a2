"""A BSP worker with gradient accumulation (AntDT-DD): for each step it writes
the records of each micro-batch it trained and the gradient after
job.allreduce_gradients to LEDGER/<rank>.jsonl; the model never changes, so the
test can recompute every step's full-batch gradient in one process.
usage: dd_grad_worker.py LEDGER STEP_SLEEP_S"""

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import dtlaunch


def data(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(size, 3, generator=g, dtype=torch.float64)
    return x, x @ torch.tensor([[1.0], [-2.0], [0.5]], dtype=torch.float64) + 0.1


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 1).double()


if __name__ == "__main__":
    ledger, sleep_s = Path(sys.argv[1]), float(sys.argv[2])
    net = model()
    dist.init_process_group("gloo")
    job = dtlaunch.init()
    x, y = data(job.dataset.dataset_size)
    micro: list[list[int]] = []
    with (ledger / f"{job.rank}.jsonl").open("w") as out:
        for batch in job.bsp_batches():
            if batch:
                loss = torch.nn.functional.mse_loss(net(x[batch]), y[batch])
                (loss * job.micro_batch_weight).backward()
            micro.append(batch)
            if not job.is_accumulation_boundary:
                continue
            time.sleep(sleep_s)
            job.allreduce_gradients(net)
            grads = [p.grad.reshape(-1).tolist() for p in net.parameters()]
            out.write(json.dumps({"step": job.step_count, "micro": micro, "grad": grads}) + "\n")
            out.flush()
            micro = []
            net.zero_grad()
            job.step()
    job.close()
    dist.destroy_process_group()
