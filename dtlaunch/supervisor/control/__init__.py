"""The straggler control loop (AntDT §V-D, §V-E): Monitor -> policy -> actions.

- ``actions``     the actions a policy emits (Table II)
- ``monitor``     per-node sliding windows of step reports, I/O-free
- ``windows``     the Monitor's columnar report store (running sums per window)
- ``snapshot``    what a policy may look at: the Monitor's frozen view and its records
- ``policies/``   ``--policy`` parsing and the built-in policies
- ``controller``  feeds the Monitor, asks the policy every interval; keeps the batch plan
- ``loop``        the edge: ``ReportIntake`` (reports into the event log and the
                  Controller) and ``ControlLoop`` (decides every tick, carries out)
- ``stall``       the stall watchdog: no progress for the stall bound is a stall
- ``stacks``      the stall's diagnosis: what each running process did last, and
                  its Python stacks asked of its agent with a bounded wait

Everything but ``loop`` and ``stacks`` is I/O-free and tested with a fake clock. A policy
written outside dtlaunch imports its types from ``dtlaunch.policy``.
"""

from dtlaunch.supervisor.control.controller import Controller, host_device

__all__ = ["Controller", "host_device"]
