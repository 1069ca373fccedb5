"""This host's shared LoRA bases, as the engine keeps them in its spill directory.

The one webapp module that reads them: through the engine's torch-free index (`worker.engine.base_index`, by
way of `webapp.worker_door`), never the engine's builder, which loads torch. Each base is one read-only copy of
a checkpoint's frozen weights that every LoRA trial on that checkpoint reads; its ``refs`` name those trials
by queue id.
"""

from __future__ import annotations

from pathlib import Path

from webapp.worker_door import bases


class HostBasesError(OSError):
    """The spill directory's bases cannot be read (permissions, a damaged index); the message says which."""


def host_bases(spill_dir: Path) -> list[dict[str, object]]:
    """Every shared base of this host: ``key``, ``bytes`` and ``trials`` (the queue ids of the trials using it)."""
    try:
        return bases(spill_dir)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise HostBasesError(f"the shared bases in {Path(spill_dir)} cannot be read: {error}") from error
