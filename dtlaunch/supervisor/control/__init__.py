"""The straggler control loop (AntDT §V-D, §V-E): Monitor -> policy -> actions.

- ``actions``     the actions a policy emits (Table II)
- ``monitor``     per-node sliding windows of step reports, I/O-free
- ``policies/``   ``--policy`` parsing and the built-in policies
- ``controller``  feeds the Monitor, asks the policy every interval
- ``intake``      step reports into the event log and the Controller
"""

from dtlaunch.supervisor.control.controller import Controller

__all__ = ["Controller"]
