"""``dtlaunch.init()``: connect a training script to its job and return the ``Job``.

Under ``dtlaunch run`` (``DTLAUNCH_SUPERVISOR`` set) the records come from the
supervisor's Stateful DDS; without it the script runs standalone over the whole
data set, for debugging with plain ``python train.py``.
"""

from __future__ import annotations

import logging
import os

from dtlaunch.errors import ConfigError
from dtlaunch.proctitle import name_this_process
from dtlaunch.runtime.client import SupervisorClient
from dtlaunch.runtime.context import Job
from dtlaunch.runtime.dataset_args import check_args_agree, dataset_from_args, given_dataset_args
from dtlaunch.runtime.environ import (
    DEFAULT_INIT_TIMEOUT_S,
    ENV_INIT_TIMEOUT,
    ENV_REPORT_INTERVAL,
    ENV_ROLE,
    ENV_SUPERVISOR,
    connection_from_env,
    env_float,
    env_int,
)
from dtlaunch.runtime.standalone import StandaloneSource
from dtlaunch.runtime.steps import REPORT_EVERY_S
from dtlaunch.sharding import dataset_info

__all__ = ["init"]

logger = logging.getLogger(__name__)


def init(
    dataset_size: int | None = None,
    shard_size: int | None = None,
    epochs: int | None = None,
    global_batch: int | None = None,
    seed: int | None = None,
    *,
    prefetch: int = 2,
) -> Job:
    """Connect to the job's data sharding service and return the ``Job``.

    With ``dataset_size`` and ``shard_size`` the data set is registered (the
    other values default to ``DatasetSpec``'s); without any, the job's data set
    (from ``dtlaunch run --dataset-size ...``) is used; with only some, they are
    checked against the job's. ``prefetch`` shards are kept ready ahead of use.

    Raises:
        ConfigError: bad values, a data set that disagrees with the job's, no
            data set anywhere, a bad environment, or no supervisor answering.
        KeyFileError: the run's key files are missing or unsafe.
    """
    given = given_dataset_args(
        dataset_size=dataset_size,
        shard_size=shard_size,
        epochs=epochs,
        global_batch=global_batch,
        seed=seed,
    )
    if type(prefetch) is not int or prefetch < 0:
        raise ConfigError(f"prefetch must be an int of 0 or more (shards), got {prefetch!r}")
    endpoint = os.environ.get(ENV_SUPERVISOR)
    restart_count = env_int(os.environ, "TORCHELASTIC_RESTART_COUNT", default=0)
    if endpoint is None:
        spec = dataset_from_args(given)
        if spec is None:
            raise ConfigError(
                f"no supervisor ({ENV_SUPERVISOR} is not set), so dtlaunch.init() runs "
                "standalone and needs the data set: pass dataset_size= and shard_size= "
                "(and epochs=, global_batch=, seed= as needed)"
            )
        if os.environ.get("WORLD_SIZE", "1") != "1":
            logger.warning("standalone mode reads the whole data set as rank 0 of 1")
        source = StandaloneSource(spec)
        return Job(rank=0, world_size=1, restart_count=restart_count, dataset=spec, source=source)
    if not endpoint:
        raise ConfigError(f"{ENV_SUPERVISOR} is set but empty; it must be tcp://HOST:PORT")
    conn = connection_from_env(os.environ, endpoint, restart_count)
    name_this_process(
        os.environ.get(ENV_ROLE, "worker"),
        conn.run_id,
        f"{conn.rank}@{restart_count}",
        keep_command=True,
    )
    world_size = env_int(os.environ, "WORLD_SIZE", default=None)
    if world_size < 1 or not 0 <= conn.rank < world_size:
        raise ConfigError(
            f"rank {conn.rank} does not fit WORLD_SIZE={world_size}; "
            "run the script with dtlaunch run, which sets both"
        )
    wanted = dataset_from_args(given)
    timeout = env_float(os.environ, ENV_INIT_TIMEOUT, DEFAULT_INIT_TIMEOUT_S)
    client = SupervisorClient(
        conn,
        prefetch=prefetch,
        report_every_s=env_float(os.environ, ENV_REPORT_INTERVAL, REPORT_EVERY_S),
    )
    try:
        spec = client.negotiate(dataset_info(wanted) if wanted else None, timeout)
        if wanted is None:
            check_args_agree(spec, given)
        elif spec != wanted:  # the supervisor's run options win
            logger.warning("using the job's data set %s instead of %s", spec, wanted)
        job = Job(
            rank=conn.rank,
            world_size=world_size,
            restart_count=restart_count,
            dataset=spec,
            source=client,
        )
        client.start_fetching()
        return job
    except BaseException:
        client.close(0.0)
        raise
