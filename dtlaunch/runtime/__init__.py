"""The SDK inside training processes: ``dtlaunch.init()`` and the ``Job`` it returns.

* ``start`` — ``init``: the supervisor connection (or standalone data) and the ``Job``.
* ``context`` — ``Job``: identity, batches (and AntDT-DD's micro-batches in
  ``bsp_batches``, where an allreduce group re-forms), ``step``, ``close``.
* ``environ`` — the variables ``dtlaunch run`` sets for the process, read and checked.
* ``dataset_args`` — the data set a script passes to ``init``: checked, compared.
* ``data`` — leases cut into batches; which leases a ``step()`` acks.
* ``client`` — the supervisor connection (one background thread, asyncio, ZeroMQ).
* ``standalone`` — leases without a supervisor, for plain ``python train.py``.
* ``torch`` — ``DDSBatchSampler`` for ``torch.utils.data.DataLoader`` (needs torch;
  import ``dtlaunch.runtime.torch`` yourself).
"""

from __future__ import annotations

from dtlaunch.runtime.context import Job
from dtlaunch.runtime.start import init

__all__ = ["Job", "init"]
