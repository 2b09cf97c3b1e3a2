"""The run directory: one folder per job with everything needed to follow it.

::

    <run_dir>/job.json          the resolved JobSpec
    <run_dir>/supervisor.json   endpoints (job, status) and pid of the live supervisor
    <run_dir>/events.jsonl      every event
    <run_dir>/logs/             <role>-<rank>.log per process, agent-<host>.log per agent,
                                supervisor.log: the supervisor's own log lines
    <run_dir>/keys/             CURVE key pairs (0700 folder, 0600 files)
    <run_dir>/agents/<host>/    embedded mode: the local agent's folder
    <run_dir>/hosts.json        per host: supervisor endpoint and agent folder (for --resume)
    <run_dir>/dataset.json      the job's data set (options or a worker's registration)
    <run_dir>/ps_placement.json PS mode: the job's parameter-block placement map
    <run_dir>/wal/              the data-sharding write-ahead log
    <run_dir>/summary.json      written when the job ends
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtlaunch.config import JobSpec
from dtlaunch.errors import RunDirError


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that a reader never sees half a file, even after a crash."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, sort_keys=True, default=str)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


@dataclass(frozen=True, slots=True)
class RunDir:
    path: Path

    @property
    def job_path(self) -> Path:
        return self.path / "job.json"

    @property
    def supervisor_path(self) -> Path:
        return self.path / "supervisor.json"

    @property
    def events_path(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    def copy_log_lines(self) -> Callable[[], None]:
        """From now on dtlaunch's log lines (INFO and up) also go to
        ``logs/supervisor.log``, appended to by a resumed supervisor: what the
        supervisor said stays when its terminal is gone (a dropped ssh session,
        ``nohup`` without a file). Returns what stops it."""
        self.logs.mkdir(exist_ok=True)
        handler = logging.FileHandler(self.logs / "supervisor.log", encoding="utf-8")
        handler.setLevel(logging.INFO)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger = logging.getLogger("dtlaunch")
        logger.addHandler(handler)

        def stop() -> None:
            logger.removeHandler(handler)
            handler.close()

        return stop

    @property
    def keys(self) -> Path:
        return self.path / "keys"

    @property
    def agents(self) -> Path:
        return self.path / "agents"

    @property
    def summary_path(self) -> Path:
        return self.path / "summary.json"

    @classmethod
    def create(cls, spec: JobSpec) -> RunDir:
        """Make a fresh run directory for ``spec``.

        Raises:
            RunDirError: when it already holds a job (use --resume or another --run-dir).
        """
        run = cls(spec.run_dir)
        if run.job_path.exists():
            raise RunDirError(
                f"{spec.run_dir} already holds a job; pass another --run-dir, "
                f"or --resume {spec.run_dir} to continue it"
            )
        try:
            run.path.mkdir(parents=True, exist_ok=True)
            run.logs.mkdir(exist_ok=True)
            run.agents.mkdir(mode=0o700, exist_ok=True)
            write_json_atomic(run.job_path, json.loads(spec.to_json()))
        except (FileExistsError, NotADirectoryError):
            blocking = next(
                (p for p in (run.path, *run.path.parents) if p.exists() and not p.is_dir()),
                run.path,
            )
            raise RunDirError(
                f"--run-dir {spec.run_dir}: {blocking} is a file, not a folder; "
                "pass a folder that does not exist yet (or a new one under ./runs)"
            ) from None
        except OSError as err:
            raise RunDirError(
                f"--run-dir {spec.run_dir}: cannot create it ({err.strerror}); "
                "pass a folder you may write to"
            ) from None
        return run

    @classmethod
    def open(cls, path: Path) -> RunDir:
        """An existing run directory.

        Raises:
            RunDirError: when ``path`` is not a run directory.
        """
        run = cls(path)
        if not run.job_path.is_file() and run.logs.is_dir():
            # create() makes logs/ first and job.json last: it stopped in between.
            raise RunDirError(
                f"{path} has no job.json: its supervisor stopped before the job was set "
                "up, so nothing ran and there is nothing to resume. Start the job again "
                f"with the same dtlaunch run command (--run-dir {path} is reused)"
            )
        if not run.job_path.is_file():
            raise RunDirError(
                f"{path} is not a dtlaunch run directory (no job.json); "
                "run directories are under ./runs by default"
            )
        return run

    def spec(self) -> JobSpec:
        return JobSpec.from_json(self.job_path.read_text())

    def write_supervisor(self, *, endpoint: str, pid: int, status_endpoint: str = "") -> None:
        """Where the live supervisor listens: ``endpoint`` for agents, workers
        and control clients, ``status_endpoint`` for read-only status clients."""
        info: dict[str, Any] = {"endpoint": endpoint, "pid": pid}
        if status_endpoint:
            info["status_endpoint"] = status_endpoint
        write_json_atomic(self.supervisor_path, info)

    def supervisor_started(self) -> bool:
        """Whether a supervisor of this job ever bound its endpoint (and so may
        have started agents that a resumed one must find again)."""
        return self.supervisor_path.is_file()

    def supervisor(self) -> dict[str, Any]:
        """Endpoint and pid of the supervisor that runs (or ran) this job.

        Raises:
            RunDirError: when no supervisor ever started here.
        """
        try:
            data: dict[str, Any] = json.loads(self.supervisor_path.read_text())
        except (OSError, ValueError) as err:
            raise RunDirError(f"{self.path}: no supervisor information ({err})") from err
        return data

    @property
    def hosts_path(self) -> Path:
        return self.path / "hosts.json"

    def hosts(self) -> dict[str, dict[str, str]]:
        """Per host: the supervisor endpoint it uses and its agent's folder."""
        try:
            data: dict[str, dict[str, str]] = json.loads(self.hosts_path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            raise RunDirError(f"{self.hosts_path} is unreadable: {err}") from err
        return data

    def write_hosts(self, hosts: dict[str, dict[str, str]]) -> None:
        write_json_atomic(self.hosts_path, hosts)

    @property
    def repaired_marker(self) -> Path:
        return self.path / "wal" / "REPAIRED"

    def mark_wal_repaired(self, report: str) -> None:
        self.repaired_marker.write_text(report + "\n")

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json_atomic(self.summary_path, summary)
