"""What one buffer's trip through the spill store costs on this host's tier, against an in-memory copy.

A unit reads its shard's buffers from the spill store into new tensors and stages new versions of what it
changed; the commit then retires the versions they replace, and the next version of a buffer is written over a
retired file of its size (the store's pool, see worker/engine/spill_pool.py). This script does exactly that with
the store's own code, for one buffer of ``--mb`` MB (default 64, about half a SmolLM2-135M shard's weights under
a 200 MB budget), under ``--spill-dir`` (default /dev/shm), on one thread, and times, best of ``--reps``
(default 9; ``--quick``, as ``make benchmarks`` runs every script: 16 MB, 3):

- ``write_s``: staging a new version of the buffer and committing it;
- ``read_s``: reading the committed version into a new tensor;
- ``copy_s``: the baseline, copying the same tensor into a new one in memory (``clone``).

On a tmpfs the kernel keeps files in 4 KiB pages unless the filesystem is mounted with ``huge=within_size`` (or
``always``), as the compose files mount the spill volume (docs/operations.md); run it on both to see what the
option changes on a host.

The last line is one JSON object: ``{"spill_dir", "fs", "mount_options", "mb", "write_s", "read_s", "copy_s",
"write_ratio", "read_ratio"}``; the ratios are seconds over ``copy_s`` in the same run (1.0: as cheap as copying
in memory).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from worker.engine.spill_store import SpillStore


def mount_of(path: Path) -> tuple[str, str]:
    """The filesystem type and mount options of the mount that holds ``path`` (the longest matching mount point)."""
    best = ("", "", "")
    target = str(path.resolve())
    with open("/proc/mounts") as mounts:
        for line in mounts:
            _, point, fs, options, *_ = line.split()
            if (target == point or target.startswith(point.rstrip("/") + "/")) and len(point) >= len(best[0]):
                best = (point, fs, options)
    return best[1], best[2]


def best_of(reps: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spill-dir", type=Path, default=Path("/dev/shm"),
                        help="the tier to measure (default /dev/shm)")
    parser.add_argument("--mb", type=int, help="the buffer's size in MB (default 64; quick 16)")
    parser.add_argument("--reps", type=int, help="timed repetitions, best kept (default 9; quick 3)")
    parser.add_argument("--quick", action="store_true", help="a 16 MB buffer, 3 repetitions")
    args = parser.parse_args()
    args.mb = args.mb if args.mb is not None else 16 if args.quick else 64
    args.reps = args.reps if args.reps is not None else 3 if args.quick else 9
    if args.mb < 1 or args.reps < 1:
        parser.error("--mb and --reps must be at least 1")
    if not args.spill_dir.is_dir():
        parser.error(f"--spill-dir {args.spill_dir} is not a directory")
    torch.set_num_threads(1)
    numel = args.mb * 250_000
    data = torch.randn(numel)
    with tempfile.TemporaryDirectory(prefix="hydra-spill-tier-", dir=args.spill_dir) as tmp:
        store = SpillStore.create(Path(tmp) / "store", {})
        store.write("x", data)
        store.commit()

        def write() -> None:
            store.write("x", data)
            store.commit()

        write_s = best_of(args.reps, write)
        read_s = best_of(args.reps, lambda: store.read_new("x", numel, torch.float32))
        copy_s = best_of(args.reps, data.clone)
    fs, options = mount_of(args.spill_dir)
    print(f"{args.mb} MB on {args.spill_dir} ({fs} {options}): write {write_s * 1e3:.1f} ms, read {read_s * 1e3:.1f} "
          f"ms, copy in memory {copy_s * 1e3:.1f} ms", file=sys.stderr)
    print(json.dumps({"spill_dir": str(args.spill_dir), "fs": fs, "mount_options": options, "mb": args.mb,
                      "write_s": round(write_s, 5), "read_s": round(read_s, 5), "copy_s": round(copy_s, 5),
                      "write_ratio": round(write_s / copy_s, 2), "read_ratio": round(read_s / copy_s, 2)}))


if __name__ == "__main__":
    main()
