"""A DDS worker that hangs mid-job, a stand-in for a deadlock: rank HANG_RANK
stops stepping after HANG_AFTER steps (holding its shard) on every attempt
below HANG_ATTEMPTS, for the stall watchdog's tests.

usage: stall_worker.py HANG_RANK HANG_AFTER HANG_ATTEMPTS
"""

import os
import sys
import time

import dtlaunch

hang_rank, hang_after, hang_attempts = (int(x) for x in sys.argv[1:4])


def wait_forever_for_a_peer():  # the frame the stall's stacks must show
    while True:
        time.sleep(1)


attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
job = dtlaunch.init()
for steps, _batch in enumerate(job.batches(), start=1):
    time.sleep(0.01)
    job.step()
    if job.rank == hang_rank and attempt < hang_attempts and steps >= hang_after:
        print(f"worker {job.rank} attempt {attempt}: hanging after {steps} steps", flush=True)
        wait_forever_for_a_peer()
job.close()
