"""Each rank takes an unequal slice of a fixed global batch, computes its mean
gradient, and lets dtlaunch average them weighted by batch share. Writes the
averaged gradient to OUT_DIR/<rank>.pt for the test to compare with the
single-process full-batch gradient."""

import sys
from pathlib import Path

import torch
import torch.distributed as dist

import dtlaunch

SPLITS = [(0, 5), (5, 17), (17, 30)]  # 5, 12 and 13 samples


def data():
    g = torch.Generator().manual_seed(3)
    return torch.randn(30, 4, generator=g, dtype=torch.float64), torch.randn(
        30, 1, generator=g, dtype=torch.float64
    )


def model():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1).double()


if __name__ == "__main__":
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    job = dtlaunch.init()
    x, y = data()
    lo, hi = SPLITS[job.rank]
    net = model()
    torch.nn.functional.mse_loss(net(x[lo:hi]), y[lo:hi]).backward()  # mean over this slice
    job.allreduce_gradients(net, samples=hi - lo)
    torch.save([p.grad for p in net.parameters()], out / f"{job.rank}.pt")
    dist.barrier()
    dist.destroy_process_group()
    job.close()
