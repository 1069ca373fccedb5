"""The speculative claim: a device claims its guess of the policy's choice in the survey's own script, so that
a right guess costs the unit no round trip of its own to claim.

Between two units a device loop sends the unit's completion and its next survey in one round trip
(`ShardQueue.complete_then_survey`). The policy runs in Python, on that survey, so its choice is known only
after the reply; the loop therefore passes its guess (`claim`: the policy's likely choices, best first,
from the survey before), and the survey's script, after reading the candidates, leases the first of them
still runnable (``lua/speculative_claim.lua``), unless the loop must end or the device is to plan next.
The lease comes back with the survey (`Survey.claimed`). Then:

- the policy, applied to that survey, chooses the claimed trial: the device runs it;
- it chooses another: `unclaim_then_claim` gives the claim back and claims the choice, in the one round trip
  the claim would have taken anyway.

Giving back restores what the claim changed besides the lease, which the claim kept on the trial
(``undo_device``, ``undo_message``, ``undo_active``, ``undo_served``): the trial's device and message, its
team's charge for the unit and last service, and whether its 'running' was published. The trial then goes
where the end of a unit would put it: runnable, or paused or cancelled if that was asked meanwhile
(``lua/unclaim.lua``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from worker.scheduling.queue.records import Lease, claim_ids, lease_from
from worker.scheduling.queue.scripts import Scripts


def unclaim_then_claim(scripts: Scripts, claimed: Lease, trial_ids: Sequence[str]) -> Lease | None:
    """Give back the speculative claim `claimed`, then claim the first still runnable of `trial_ids` (none:
    only give it back), in one round trip; the new lease, or None. A claim whose lease expired meanwhile has
    nothing to give back: its trial went back when the lease was requeued."""
    calls: list[tuple[str, Mapping[str, object]]] = [
        ("unclaim", {"id": claimed.trial_id, "token": claimed.token, "expired": claimed.expired,
                     "remaining_units": "", "ready": "", "ready_v": ""})]
    if trial_ids:
        calls.append(("claim", {"ids": claim_ids(trial_ids), "device": claimed.device}))
    replies = scripts.run_all(calls)
    return lease_from(replies[1], claimed.device) if trial_ids else None
