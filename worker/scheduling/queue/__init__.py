"""The shard task queue: trial states, the runnable sets and leases, in Redis, changed only by Lua scripts.

Every key of a host starts with ``hydra:<host>:`` so that several hosts can share one Redis: a trial's spill
store lives on one host and only that host's devices take its units. `worker.scheduling.keys` lists every key
the queue keeps, with its type and what it holds; all are readable with redis-cli.

States: planning -> runnable <-> running -> finished | pruned | failed; paused; cancelled. Pause and cancel
of a trial whose unit (or planning) is in flight set ``control`` and take effect when that unit ends. A lease
that expires (its worker died) puts the trial back, so another device re-runs the same unit from the spill
store. Times come from Redis's clock, so hosts with skewed clocks agree on lease expiry.

The policy stays in Python (`worker.scheduling.policy`): `ShardQueue.survey` reads the candidates, the caller
picks, and `ShardQueue.claim` takes that exact trial atomically, failing harmlessly if another device was
faster. A device loop may have its survey claim its guess of that pick in the same script
(`worker.scheduling.queue.speculative`).

- `shard_queue`: `ShardQueue`, the queue of one host;
- `records`: the lease, planning job and survey it hands a device loop, read from the scripts' replies, and a
  trial's record;
- `script_args`: the arguments it gives the survey and complete scripts, and lanes as the scripts take them;
- `scripts`: the Lua files under ``lua/`` and how they are run (EVALSHA through redis-py, in pipelines);
- `speculative`: the claim a survey makes on the device's guess, and giving it back.
"""

from worker.contract import InvalidTransition, LeaseLost, QueueError, TrialExists, TrialNotFound, TrialRecord
from worker.scheduling.queue.records import Lease, PlanJob, Survey
from worker.scheduling.queue.script_args import SURVEY_HEAD
from worker.scheduling.queue.shard_queue import ShardQueue

__all__ = ["SURVEY_HEAD", "InvalidTransition", "Lease", "LeaseLost", "PlanJob", "QueueError", "ShardQueue",
           "Survey", "TrialExists", "TrialNotFound", "TrialRecord"]
