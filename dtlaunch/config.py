"""The resolved description of one job (``JobSpec``) and its validation.

The CLI hands ``dtlaunch run``'s options over as ``RunOptions``, whose ``job_spec()``
resolves them into a ``JobSpec``; everything below the CLI reads only this. ``job.json``
in the run directory is ``JobSpec.to_json()``: a resumed supervisor rebuilds the job.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dtlaunch.errors import ConfigError
from dtlaunch.hostfile import MAX_HOST_CPUS, HostSpec, load_hosts
from dtlaunch.hostselect import select_hosts, with_processes_per_host
from dtlaunch.quantities import format_size, parse_size
from dtlaunch.sharding import DatasetSpec

MODES = ("allreduce", "ps")
MIN_CPU_LIMIT = 0.01  # the CFS quota's floor: 1 ms per 100 ms period
# torch: torchrun's variables (and ps-lite's in PS mode); tf: TensorFlow's TF_CONFIG
# too, and in PS mode dtlaunch runs TF's worker and ps tasks itself.
FRAMEWORKS = ("torch", "tf")
PS_SERVERS = ("builtin", "script")  # python -m dtlaunch.ps, or the user's own (ps-lite, TF)
PS_CONSISTENCY = ("bsp", "asp")
DEFAULT_PS_BLOCK_BYTES = 4 << 20
RESTART_SCOPES = ("group", "process")
# Below this a Python interpreter cannot start; the hostfile bounds mem= the same way.
MIN_MEMORY_LIMIT = 64 << 20
# How agents enforce limits: cgroups where usable, else rlimit/affinity; or never cgroups.
LIMITS_VIA = ("auto", "rlimit")
# Hosts reached over SSH at once (check, agent launch; see dtlaunch.fanout): well
# inside a default sshd's MaxStartups when the hosts are distinct machines, and
# enough to keep a 2-core client busy.
DEFAULT_SSH_CONCURRENCY = 64
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_concurrency(value: int, option: str = "--ssh-concurrency") -> int:
    """``value`` when it is a usable bound on hosts in progress at once (1 or more).

    Raises:
        ConfigError: ``value`` is below 1 (or not a whole number), naming the option
            and the fix.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"{option} is {value!r}; expected a whole number of hosts contacted at once, "
            f"at least 1 (default {DEFAULT_SSH_CONCURRENCY}); lower it when sshd drops "
            "connections (MaxStartups), raise it for many hosts on a fast network"
        )
    return value


def _size_option(option: str, text: str | None) -> int:
    """Bytes of a size option (0 when not given); ConfigError naming the option."""
    if not text:
        return 0
    try:
        return parse_size(text)
    except ValueError as exc:
        raise ConfigError(f"{option}: {exc}") from None


def new_run_id() -> str:
    """A sortable, unique run id: ``YYYYmmdd-HHMMSS-xxxx``."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputSpec:
    """Which processes' output is echoed to the console (log files get everything)."""

    mode: str = "all"  # "all" | "none" | "select"
    selected: tuple[str, ...] = ()  # proc ids ("worker-0") when mode == "select"

    @classmethod
    def parse(cls, text: str) -> OutputSpec:
        """``all``, ``none``, or a comma list of worker ranks / proc ids: ``0,2,server-1``.

        Raises:
            ConfigError: on an entry that is neither a rank nor a proc id.
        """
        text = text.strip()
        if text in ("all", "none"):
            return cls(mode=text)
        chosen: list[str] = []
        for item in (part.strip() for part in text.split(",")):
            if item.isdigit():
                chosen.append(f"worker-{int(item)}")
            elif re.fullmatch(r"(worker|server)-?\d+", item):
                role, rank = re.fullmatch(r"(worker|server)-?(\d+)", item).groups()  # type: ignore[union-attr]
                chosen.append(f"{role}-{int(rank)}")
            else:
                raise ConfigError(
                    f"--output: {item!r} is not a rank; expected all, none, or a comma "
                    "list like 0,3,server-1"
                )
        return cls(mode="select", selected=tuple(chosen))

    def shows(self, proc_id: str) -> bool:
        return self.mode == "all" or (self.mode == "select" and proc_id in self.selected)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    run_id: str
    run_dir: Path
    script: str
    script_args: tuple[str, ...] = ()
    module: bool = False  # run SCRIPT as ``python -m SCRIPT``
    hosts: tuple[HostSpec, ...] = ()  # empty: embedded mode on this machine
    workers: int = 1
    servers: int = 0
    mode: str = "allreduce"
    framework: str = "torch"  # one of FRAMEWORKS
    policy: str = "none"
    max_restarts: int = 3
    restart_scope: str = "group"
    # Per worker/server process (0: none, or the host's mem=/cpus= over its slots).
    memory_limit: int = 0
    cpu_limit: float = 0.0
    # A process killed for memory is relaunched with twice its limit, at most this
    # often and up to memory_max (0: the host's memory).
    oom_relaunches: int = 3
    memory_max: int = 0
    limits_via: str = "auto"  # one of LIMITS_VIA
    heartbeat_interval: float = 1.0
    dead_after: int = 3
    orphan_timeout: float = 60.0
    kill_grace: float = 5.0
    agent_timeout: float = 60.0  # how long an agent may take to connect back
    # No step and no shard change for this long is a stall (None: adaptive; 0: never).
    stall_timeout: float | None = None
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = ""
    python: str = ""
    output: OutputSpec = field(default_factory=OutputSpec)
    bind: str = ""  # supervisor ROUTER address; "" = loopback (embedded) or all interfaces
    # Prometheus endpoint on the --bind address (else loopback); 0: any free port;
    # None: none. Kept in job.json, so a resumed supervisor serves it again.
    metrics_port: int | None = None
    ssh_config: tuple[str, ...] = ()
    verify_host_keys: bool = True
    ssh_concurrency: int = DEFAULT_SSH_CONCURRENCY  # hosts an agent launch reaches at once
    inject: tuple[str, ...] = ()
    control_interval: float = 10.0  # seconds between two decisions of the policy
    created: float = 0.0  # Unix time the job was created: the job-wide clock's zero
    # The data set, when given as run options (else a worker may register it).
    dataset_size: int = 0
    shard_size: int = 0
    epochs: int = 1
    global_batch: int = 0
    seed: int = 0
    # PS mode: who serves, how updates apply, how parameters are cut, how often
    # a server writes its blocks and optimizer state to disk.
    ps_server: str = "builtin"
    ps_consistency: str = "bsp"
    ps_block_bytes: int = DEFAULT_PS_BLOCK_BYTES
    ps_snapshot_interval: float = 30.0

    @property
    def embedded(self) -> bool:
        return not self.hosts

    def dataset(self) -> DatasetSpec | None:
        """The data set given by options, or None when the workers register it."""
        if self.dataset_size == 0:
            return None
        return DatasetSpec(
            dataset_size=self.dataset_size,
            shard_size=self.shard_size,
            epochs=self.epochs,
            global_batch=self.global_batch,
            seed=self.seed,
        )

    def validate(self) -> JobSpec:
        """Check cross-field rules; returns self for chaining.

        Raises:
            ConfigError: naming the option and the fix.
        """
        if not _RUN_ID_RE.match(self.run_id):
            raise ConfigError(
                f"run id {self.run_id!r} is invalid; use letters, digits, '.', '_' or '-'"
            )
        if not self.script:
            raise ConfigError("no SCRIPT given; usage: dtlaunch run [OPTIONS] SCRIPT [ARGS]...")
        if self.workers < 1:
            raise ConfigError(f"--workers must be at least 1, got {self.workers}")
        if self.servers < 0:
            raise ConfigError(f"--servers must be 0 or more, got {self.servers}")
        if self.mode not in MODES:
            raise ConfigError(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.mode == "ps" and self.servers == 0:
            raise ConfigError("--mode ps needs parameter servers; add --servers M (M >= 1)")
        self._validate_framework()
        if self.ps_server not in PS_SERVERS:
            raise ConfigError(
                f"--ps-server must be one of {', '.join(PS_SERVERS)}, got {self.ps_server!r}"
            )
        if self.ps_consistency not in PS_CONSISTENCY:
            raise ConfigError(
                f"--ps-consistency must be one of {', '.join(PS_CONSISTENCY)}, "
                f"got {self.ps_consistency!r}"
            )
        if self.ps_block_bytes < 1:
            raise ConfigError(f"--ps-block-bytes must be positive, got {self.ps_block_bytes}")
        if self.ps_snapshot_interval < 0:
            raise ConfigError(
                f"--ps-snapshot-interval must be 0 (off) or more, got {self.ps_snapshot_interval}"
            )
        if self.restart_scope not in RESTART_SCOPES:
            raise ConfigError(
                f"--restart-scope must be one of {', '.join(RESTART_SCOPES)}, "
                f"got {self.restart_scope!r}"
            )
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts must be 0 or more, got {self.max_restarts}")
        self._validate_limits()
        for name in ("heartbeat_interval", "orphan_timeout", "kill_grace", "agent_timeout"):
            if getattr(self, name) <= 0:
                opt = "--" + name.replace("_", "-")
                raise ConfigError(f"{opt} must be positive, got {getattr(self, name)}")
        if self.stall_timeout is not None and not (0 <= self.stall_timeout < float("inf")):
            raise ConfigError(
                "--stall-timeout must be 0 (never) or a number of seconds, "
                f"got {self.stall_timeout}"
            )
        if self.bind:
            address = self.bind.removeprefix("tcp://")
            host, colon, port = address.rpartition(":")
            if not colon or not host or not port.isdigit() or int(port) > 65535:
                raise ConfigError(
                    f"--bind {self.bind!r}: expected ADDR:PORT, e.g. 10.0.0.5:0 "
                    "(port 0: any free port)"
                )
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(
                f"--metrics-port must be a TCP port from 1 to 65535 (or 0: any free port), "
                f"got {self.metrics_port}"
            )
        if self.control_interval <= 0:
            raise ConfigError(f"--control-interval must be positive, got {self.control_interval}")
        check_concurrency(self.ssh_concurrency)
        if self.mode == "ps" and self.policy.partition(":")[0].strip() == "dd":
            raise ConfigError(
                "--policy dd plans gradient accumulation for allreduce jobs (job.bsp_batches); "
                "a parameter-server job has no accumulation passes: use --policy lb-bsp or nd"
            )
        self._validate_psld()
        self._validate_rna()
        if self.dead_after < 2:
            raise ConfigError(f"--dead-after must be at least 2 intervals, got {self.dead_after}")
        if self.orphan_timeout < self.heartbeat_interval * self.dead_after:
            raise ConfigError(
                "--orphan-timeout must be longer than heartbeat interval x dead-after "
                f"({self.heartbeat_interval * self.dead_after:g} s)"
            )
        for key in self.env:
            if not _ENV_KEY_RE.match(key):
                raise ConfigError(f"--env: {key!r} is not a valid variable name")
        if self.dataset_size < 0:
            raise ConfigError(f"--dataset-size must be positive, got {self.dataset_size}")
        if self.dataset_size and not self.shard_size:
            raise ConfigError("--dataset-size needs --shard-size (records per shard)")
        if self.shard_size and not self.dataset_size:
            raise ConfigError("--shard-size needs --dataset-size (records in the data set)")
        dataset = self.dataset()
        if dataset is not None:
            dataset.validate()
        return self

    def _validate_rna(self) -> None:
        name, _, raw = self.policy.partition(":")
        if name.strip() != "rna":
            return
        hierarchical = dict(kv.partition("=")[::2] for kv in raw.split(",")).get("hierarchical")
        if self.mode == "ps" and (self.ps_server != "builtin" or hierarchical == "off"):
            raise ConfigError(
                "--policy rna with --servers is hierarchical RNA, whose groups exchange "
                "through dtlaunch's built-in parameter server: use --ps-server builtin and "
                "hierarchical=auto, or drop --servers"
            )
        if self.restart_scope != "process":
            raise ConfigError(
                "--policy rna keeps the survivors training while a failed worker restarts "
                "and rejoins; use --restart-scope process (its default under rna)"
            )

    def _validate_psld(self) -> None:  # psld and auto act through dtlaunch's own servers
        name = self.policy.partition(":")[0].strip()
        if name not in ("psld", "auto"):
            return
        if self.mode != "ps" or self.ps_server != "builtin" or self.framework == "tf":
            what = "moves parameter blocks between" if name == "psld" else "sizes the workers of"
            raise ConfigError(
                f"--policy {name} {what} dtlaunch's built-in parameter servers; run a PS job "
                "with --servers N (and the default --ps-server builtin)"
            )
        if name == "auto":
            return
        if self.servers < 2:
            raise ConfigError(
                f"--policy psld spreads the blocks over the servers by their speed; with "
                f"--servers {self.servers} there is nowhere to move them: use --servers 2 or more"
            )

    def _validate_limits(self) -> None:
        if self.memory_limit and self.memory_limit < MIN_MEMORY_LIMIT:
            raise ConfigError(
                f"--memory-limit {self.memory_limit} bytes is too small to start Python; "
                "expected at least 64M (e.g. --memory-limit 4G)"
            )
        if not 0 <= self.cpu_limit <= MAX_HOST_CPUS:
            raise ConfigError(
                f"--cpu-limit must be a number of CPUs above 0 (e.g. 2 or 0.5), "
                f"got {self.cpu_limit}"
            )
        if 0 < self.cpu_limit < MIN_CPU_LIMIT:
            raise ConfigError(
                f"--cpu-limit {self.cpu_limit} is below the kernel's least CPU quota "
                f"({MIN_CPU_LIMIT} CPUs, 1 ms per 100 ms); give {MIN_CPU_LIMIT} or more"
            )
        if self.limits_via not in LIMITS_VIA:
            raise ConfigError(
                f"--limits-via must be one of {', '.join(LIMITS_VIA)}, got {self.limits_via!r}"
            )
        if self.oom_relaunches < 0:
            raise ConfigError(f"--oom-relaunches must be 0 or more, got {self.oom_relaunches}")
        if self.memory_max and self.memory_max < max(self.memory_limit, MIN_MEMORY_LIMIT):
            raise ConfigError(
                f"--memory-max ({format_size(self.memory_max)}) is below --memory-limit "
                f"({format_size(self.memory_limit)}) or 64M; raise it or leave it out "
                "(then the host's memory bounds the growth)"
            )
        small = [
            f"{h.label} (mem={format_size(h.memory_bytes)} over {h.slots} slots)"
            for h in self.hosts
            if h.memory_bytes
            and not self.memory_limit
            and h.memory_bytes // h.slots < MIN_MEMORY_LIMIT
        ]
        if small:
            raise ConfigError(
                f"less than 64M per process on {', '.join(small)}; declare more memory, "
                "fewer slots, or give --memory-limit"
            )

    def _validate_framework(self) -> None:
        if self.framework not in FRAMEWORKS:
            raise ConfigError(
                f"--framework must be one of {', '.join(FRAMEWORKS)}, got {self.framework!r}"
            )
        if self.framework != "tf":
            return
        if self.policy.split(":", 1)[0].strip() not in ("", "none"):
            raise ConfigError(
                f"--policy {self.policy} acts through dtlaunch's SDK and torch.distributed "
                "(batch plans, regroups onto spare hosts), which TensorFlow's strategies do "
                "not follow: their cluster is fixed in TF_CONFIG, and in PS mode TF's "
                "coordinator already hands each step to whichever worker is free; drop --policy"
            )
        if self.mode != "ps":
            return
        if self.workers < 2:
            raise ConfigError(
                f"--framework tf in PS mode runs worker 0 as TensorFlow's chief and the "
                f"others as its workers, so it needs --workers 2 or more (got {self.workers}); "
                "e.g. --workers 3 --servers 2 is a chief, 2 workers and 2 ps tasks"
            )
        if self.ps_server != "builtin":
            raise ConfigError(
                "--framework tf starts TensorFlow's ps tasks itself; drop "
                f"--ps-server {self.ps_server} (a script that starts its own servers runs "
                "with --framework torch --ps-server script and reads DMLC_ROLE)"
            )

    def to_json(self) -> str:
        data = asdict(self)
        data["run_dir"] = str(self.run_dir)
        return json.dumps(data, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        """Rebuild a spec written by ``to_json``.

        Raises:
            ConfigError: when the text is not a job.json of this version.
        """
        try:
            data: dict[str, Any] = json.loads(text)
            data["run_dir"] = Path(data["run_dir"])
            data["hosts"] = tuple(HostSpec(**h) for h in data["hosts"])
            data["output"] = OutputSpec(
                mode=data["output"]["mode"], selected=tuple(data["output"]["selected"])
            )
            for key in ("script_args", "ssh_config", "inject"):
                data[key] = tuple(data[key])
            return cls(**data)
        except (ValueError, KeyError, TypeError) as err:
            raise ConfigError(f"job.json is not a dtlaunch job description: {err}") from err


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    """``dtlaunch run``'s options as given, by option name (None or empty: not
    given), before the defaults that depend on other options are filled in.

    The defaults are the command line's (``tests/test_cli.py`` holds the two
    equal), so ``dtlaunch.launch`` and ``dtlaunch run`` start the same job."""

    script: str
    script_args: list[str] | None = None
    module: bool = False
    hosts: str | None = None  # hostfile path or inline list; None: embedded mode
    include: str | None = None  # DeepSpeed's host filters over the hostfile
    exclude: str | None = None
    workers: int | None = None  # None: nproc_per_node x hosts, else 1
    nproc_per_node: int | None = None  # torchrun's: workers on every host
    servers: int = 0
    mode: str | None = None
    framework: str = "torch"
    ps_server: str = "builtin"
    ps_consistency: str = "bsp"
    ps_block_bytes: int = DEFAULT_PS_BLOCK_BYTES
    ps_snapshot_interval: float = 30.0
    policy: str = "none"
    control_interval: float = 10.0
    inject: list[str] | None = None
    run_dir: Path | None = None
    max_restarts: int = 3
    restart_scope: str | None = None
    memory_limit: str | None = None  # a size: 512M, 4G
    cpu_limit: float | None = None
    oom_relaunches: int = 3
    memory_max: str | None = None
    limits_via: str = "auto"
    heartbeat_interval: float = 1.0
    dead_after: int = 3
    orphan_timeout: float = 60.0
    agent_timeout: float = 60.0
    kill_grace: float = 5.0
    stall_timeout: float | None = None
    env: list[str] | None = None
    env_file: Path | None = None
    workdir: str | None = None
    python: str | None = None
    output: str = "all"
    bind: str | None = None
    metrics_port: int | None = None
    ssh_config: list[Path] | None = None
    insecure_no_host_key_check: bool = False
    ssh_concurrency: int = DEFAULT_SSH_CONCURRENCY
    dataset_size: int = 0
    shard_size: int = 0
    epochs: int = 1
    global_batch: int = 0
    seed: int = 0

    def job_spec(self) -> JobSpec:
        """The validated ``JobSpec`` of these options under a new run id.

        Defaults: mode ``ps`` when there are servers, else ``allreduce``; restart
        scope ``group`` in allreduce mode, else ``process``; run dir
        ``./runs/<run-id>``; workdir the current one; python this interpreter.

        Raises:
            HostfileError: the hostfile (or inline list) is invalid.
            ConfigError: an option, or a combination of them, is invalid.
        """
        mode = self.mode or ("ps" if self.servers > 0 else "allreduce")
        hosts, workers = self._hosts_and_workers()
        run_id = new_run_id()
        return JobSpec(
            run_id=run_id,
            run_dir=(self.run_dir or Path("runs") / run_id).absolute(),
            script=self.script,
            script_args=tuple(self.script_args or ()),
            module=self.module,
            hosts=tuple(hosts),
            workers=workers,
            servers=self.servers,
            mode=mode,
            framework=self.framework,
            policy=self.policy,
            max_restarts=self.max_restarts,
            restart_scope=self.restart_scope or _default_restart_scope(mode, self.policy),
            memory_limit=_size_option("--memory-limit", self.memory_limit),
            cpu_limit=self.cpu_limit or 0.0,
            oom_relaunches=self.oom_relaunches,
            memory_max=_size_option("--memory-max", self.memory_max),
            limits_via=self.limits_via,
            heartbeat_interval=self.heartbeat_interval,
            dead_after=self.dead_after,
            orphan_timeout=self.orphan_timeout,
            kill_grace=self.kill_grace,
            agent_timeout=self.agent_timeout,
            stall_timeout=self.stall_timeout,
            env=parse_env_pairs(list(self.env or []), self.env_file),
            workdir=self.workdir or os.getcwd(),
            python=self.python or sys.executable,
            output=OutputSpec.parse(self.output),
            bind=self.bind or "",
            metrics_port=self.metrics_port,
            ssh_config=tuple(str(p.expanduser()) for p in self.ssh_config or []),
            verify_host_keys=not self.insecure_no_host_key_check,
            ssh_concurrency=self.ssh_concurrency,
            dataset_size=self.dataset_size,
            shard_size=self.shard_size,
            epochs=self.epochs,
            global_batch=self.global_batch,
            seed=self.seed,
            control_interval=self.control_interval,
            inject=tuple(self.inject or ()),
            ps_server=self.ps_server,
            ps_consistency=self.ps_consistency,
            ps_block_bytes=self.ps_block_bytes,
            ps_snapshot_interval=self.ps_snapshot_interval,
            created=time.time(),
        ).validate()

    def _hosts_and_workers(self) -> tuple[list[HostSpec], int]:
        """The hosts the job runs on and its worker count, from ``-H``, the host
        filters, ``--workers`` and ``--nproc-per-node``.

        Raises:
            HostfileError: the hostfile is invalid or a filter names no host of it.
            ConfigError: the filters or ``--nproc-per-node`` do not fit the other options.
        """
        if not self.hosts and (self.include or self.exclude):
            raise ConfigError(
                "--include/--exclude select hosts of a hostfile; give one with -H/--hostfile"
            )
        hosts = load_hosts(self.hosts) if self.hosts else []
        if hosts:
            hosts = select_hosts(hosts, include=self.include, exclude=self.exclude)
        if self.nproc_per_node is None:
            return hosts, 1 if self.workers is None else self.workers
        if self.nproc_per_node < 1:
            raise ConfigError(f"--nproc-per-node must be at least 1, got {self.nproc_per_node}")
        if self.workers is not None:
            raise ConfigError(
                "--nproc-per-node and --workers/-np both set the worker count; give one: "
                "--nproc-per-node N runs N workers on every host, --workers N runs N in all"
            )
        running = [h for h in hosts if not h.spare]
        return with_processes_per_host(hosts, self.nproc_per_node), self.nproc_per_node * max(
            1, len(running)
        )


def parse_env_pairs(pairs: list[str], env_file: Path | None) -> dict[str, str]:
    """``--env K=V`` (repeatable) over ``--env-file F`` (``K=V`` lines, ``#`` comments).

    Raises:
        ConfigError: on a line or pair without ``=``, naming where it came from.
    """
    env: dict[str, str] = {}
    if env_file is not None:
        try:
            lines = env_file.read_text().splitlines()
        except OSError as err:
            raise ConfigError(f"--env-file {env_file}: {err.strerror}") from err
        for lineno, raw in enumerate(lines, start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("export "):
                line = line[len("export ") :].strip()
            key, sep, value = line.partition("=")
            if not sep:
                raise ConfigError(f"{env_file}:{lineno}: expected KEY=VALUE, got {raw!r}")
            env[key.strip()] = value.strip().strip("'\"")
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"--env {pair!r}: expected KEY=VALUE")
        env[key] = value
    return env


def _default_restart_scope(mode: str, policy: str) -> str:
    """torchrun restarts the whole group of an allreduce job: a static world
    cannot lose a member. RNA's groups re-form around the survivors instead."""
    if mode == "allreduce" and policy.partition(":")[0].strip() != "rna":
        return "group"
    return "process"
