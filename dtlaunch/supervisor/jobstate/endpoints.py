"""Where ``JobState``'s processes listen: the torch.distributed master port of an
attempt, and the ports of built-in parameter servers (and their endpoints, which
the workers are given)."""

from __future__ import annotations

from dtlaunch.supervisor.jobstate.base import JobStateBase
from dtlaunch.supervisor.jobstate.nodes import AgentState, ProcSlot

__all__ = ["MASTER_PORT_SLOTS", "SERVERS_PER_HOST_MAX", "Endpoints"]

# The first agent free ports alternate as MASTER_PORT; built-in PS servers take the
# rest (the agent finds FREE_PORTS = MASTER_PORT_SLOTS + SERVERS_PER_HOST_MAX).
MASTER_PORT_SLOTS = 2
SERVERS_PER_HOST_MAX = 6


class Endpoints(JobStateBase):
    def _place_ps(self, slot: ProcSlot) -> bool:
        """Built-in PS: a server's port, a worker's server endpoints; False until known."""
        if slot.role == "server":
            slot.ps_port = self._server_port(slot)
            return slot.ps_port != 0
        endpoints = []
        for server in sorted(self._servers(), key=lambda s: s.rank):
            agent = self.agents[server.host]
            port = self._server_port(server)
            if port == 0:
                return False
            endpoints.append(f"tcp://{self._master_addr_of(server.host, agent.host_addr)}:{port}")
        slot.ps_servers = tuple(endpoints)
        return True

    def server_endpoint(self, rank: int) -> str:
        """Where built-in PS server ``rank`` listens now ("" while unknown)."""
        slot = self.procs.get(f"server-{rank}")
        if slot is None:
            return ""
        agent = self.agents.get(slot.host)
        port = self._server_port(slot) if agent is not None else 0
        if agent is None or port == 0:
            return ""
        return f"tcp://{self._master_addr_of(slot.host, agent.host_addr)}:{port}"

    def _servers(self) -> list[ProcSlot]:
        return [s for s in self.procs.values() if s.role == "server"]

    def _server_port(self, server: ProcSlot) -> int:
        """A server's port on its host: one of the agent's free ports after the ones
        kept for MASTER_PORT, the same for every attempt on that host (so the
        workers' endpoints stay valid across its restarts); 0 if unknown. A server
        that moves to a host takes a port index no server used there before (the
        one it replaces may still be bound to its own)."""
        agent = self.agents[server.host]
        if agent.state is not AgentState.UP:
            return 0
        index = self.ps_port_index.get((server.host, server.rank))
        if index is None:
            taken = {i for (host, _), i in self.ps_port_index.items() if host == server.host}
            index = next(i for i in range(MASTER_PORT_SLOTS, 1 << 16) if i not in taken)
            self.ps_port_index[server.host, server.rank] = index
        return agent.free_ports[index] if index < len(agent.free_ports) else 0

    def _master_endpoint(self, master: ProcSlot | None, slot: ProcSlot) -> tuple[str, int]:
        if master is None:
            return "", 0
        agent = self.agents[master.host]
        if agent.state is not AgentState.UP or not agent.free_ports:
            return "", 0
        addr = self._master_addr_of(master.host, agent.host_addr)
        # A fresh port per attempt: the previous store may still be closing.
        port = agent.free_ports[master.attempt % min(MASTER_PORT_SLOTS, len(agent.free_ports))]
        return addr, port
