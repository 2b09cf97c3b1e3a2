"""Hierarchical RNA's exchange with the parameter server, a worker's side (RNA §4).

Under hierarchical RNA the workers run their rounds in groups, and the groups
meet at dtlaunch's built-in parameter server (``--servers 1``, asynchronous:
ASP). Every few rounds of its group (``RnaStart.exchange``) the round's
initiator calls ``ServerExchange.push_pull``: it pushes ``weight x (model -
base)`` - the group's progress since its last exchange, ``base`` being the
model that exchange gave it, weighted by the group's share of the workers - to
a server that runs plain SGD at rate 1 on the negated push, so the server's
model moves by exactly that much, and pulls the server's model, which the
group takes (the communication thread broadcasts it). This is asynchronous
model averaging: two groups of four that each made progress ``d_a`` and
``d_b`` from the same model leave the server at ``(d_a + d_b) / 2`` past it,
whichever pushed first. The first push of a job seeds the server with the
pushing group's base (``dtlaunch.ps.Client`` offers its tensors to an empty
server), so the server starts where the groups started.

The client is made on first use, by the communication thread that owns it
(its sockets are used by that thread only). It follows the job's placement map
like any client, but is no listener of the job's data waits: those are called
from the training thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

__all__ = ["ExchangeClient", "ServerExchange", "job_client_factory"]


class ExchangeClient(Protocol):
    """What ``ServerExchange`` uses of ``dtlaunch.ps.Client``."""

    def push(self, samples: int | None = None) -> None: ...

    def pull(self, *, final: bool | None = None) -> None: ...

    def close(self, *, notify: bool = True) -> None: ...


ClientFactory = Callable[[torch.nn.Module], ExchangeClient]


class _Mirror(torch.nn.Module):
    """Parameters shaped as the group's model: what the client pushes from and
    pulls into."""

    def __init__(self, like: Sequence[torch.Tensor]) -> None:
        super().__init__()
        self.tensors = torch.nn.ParameterList(
            torch.nn.Parameter(t.detach().clone(), requires_grad=True) for t in like
        )


class _ExchangeJobView:
    """The job as the exchange's client sees it: the placement map and where
    the servers listen (thread-safe requests to the supervisor). An exchange
    is no training step: its time is not the step's communication (it runs
    beside the training loop), it never drops records, and the data's end
    does not make its pull a final one; and it is no listener of the job's data
    waits (``add_data_wait_listener`` is left out on purpose: the training
    thread calls those)."""

    data_ended = False

    def __init__(self, job: Any) -> None:
        self._job = job

    def ps_placement(self, planned: Any) -> Any:
        return self._job.ps_placement(planned)

    @property
    def ps_endpoints(self) -> list[str]:
        return list(self._job.ps_endpoints)

    def record_comm(self, seconds: float) -> None:
        pass

    def record_wait(self, seconds: float) -> None:
        pass

    def record_server_comm(self, server: int, nbytes: int, seconds: float) -> None:
        pass

    def mark_dropped(self) -> None:
        pass


def job_client_factory(job: Any) -> ClientFactory:
    """Clients of the job's servers (``DTLAUNCH_PS_SERVERS``, the run's keys)."""

    def make(model: torch.nn.Module) -> ExchangeClient:
        from dtlaunch.ps import Client

        return Client(model, "sgd", lr=1.0, job=_ExchangeJobView(job))

    return make


class ServerExchange:
    """One worker's exchanges with the parameter server (module docstring)."""

    def __init__(self, factory: ClientFactory) -> None:
        self._factory = factory
        self._client: ExchangeClient | None = None
        self._mirror: _Mirror | None = None
        self.exchanges = 0

    def push_pull(
        self, model: Sequence[torch.Tensor], base: Sequence[torch.Tensor], weight: float
    ) -> torch.Tensor:
        """Push ``weight x (model - base)``, pull the server's model (returned
        flat, its tensors one after the other as in ``model``).

        Raises:
            Exception: whatever the client raises (``PsError``, ``ConfigError``,
                a timeout): the server's model did not come; the next exchange
                makes a new client.
        """
        if self._client is None:
            mirror = _Mirror(base)  # an empty server is seeded with the group's base
            try:
                self._client = self._factory(mirror)
            except BaseException:
                self._client = None
                raise
            self._mirror = mirror
        assert self._mirror is not None
        params = list(self._mirror.tensors)
        try:
            with torch.no_grad():
                for param, now, then in zip(params, model, base, strict=True):
                    param.grad = (then - now) * weight  # SGD at rate 1: + weight x progress
            self._client.push(1)
            self._client.pull(final=False)
        except BaseException:
            self.close(notify=False)
            raise
        self.exchanges += 1
        return torch.cat([p.detach().reshape(-1) for p in params])

    def close(self, *, notify: bool = True) -> None:
        client, self._client, self._mirror = self._client, None, None
        if client is not None:
            client.close(notify=notify)
