"""What reading a dataset file row by row, under the limits of a row, costs against Python's own readers.

The same instruction rows (Alpaca-shaped, answers of a few hundred characters) are written as JSONL, as a JSON
array (indented, as tools save them) and as CSV, and each file is read by `webapp.datasets.file_rows.text_rows`,
which bounds every row (1 MiB, 100 levels of nesting) and reads a JSON array element by element, and by the
plain baseline: ``json.loads`` of each line, ``json.loads`` of the whole array, ``csv.DictReader``. Times are
the best of ``--rounds`` alternating rounds; the JSON array's peak Python memory (tracemalloc) is measured once
each way, since the baseline holds the whole text and every row at once.

The last line is one JSON object: ``{"rows", "megabytes": {format: ...}, "seconds": {format: {"bounded",
"plain"}}, "ratio": {format: bounded ÷ plain time}, "array_peak_ratio": plain ÷ bounded peak memory}``. Target:
each ratio at most 3 (the row rules may cost, but not change the order of, a read that the build's tokenizer
training outlasts many times).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import time
import tracemalloc
from collections.abc import Callable

from webapp.datasets.file_rows import text_rows


def rows(n: int) -> list[dict[str, str]]:
    return [{"instruction": f"Explain item {k} in a sentence.", "input": "" if k % 3 else f"context {k}",
             "output": f"Item {k} is a thing that does one thing well. " * 6} for k in range(n)]


def files(data: list[dict[str, str]]) -> dict[str, tuple[str, bytes]]:
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=list(data[0]))
    writer.writeheader()
    writer.writerows(data)
    return {"jsonl": (".jsonl", "".join(json.dumps(row) + "\n" for row in data).encode()),
            "json": (".json", json.dumps(data, indent=2).encode()),
            "csv": (".csv", table.getvalue().encode())}


def plain(name: str, content: bytes) -> int:
    if name == "jsonl":
        return sum(1 for line in content.splitlines() if json.loads(line))
    if name == "json":
        return len(json.loads(content))
    return sum(1 for _ in csv.DictReader(io.StringIO(content.decode())))


def bounded(suffix: str, content: bytes) -> int:
    return sum(1 for _ in text_rows(io.BytesIO(content), suffix=suffix))


def timed(read: Callable[[], int]) -> float:
    started = time.perf_counter()
    read()
    return time.perf_counter() - started


def peak(read: Callable[[], int]) -> int:
    tracemalloc.start()
    try:
        read()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000, help="rows in each file (default 100,000)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the best of each is kept")
    parser.add_argument("--quick", action="store_true", help="10,000 rows, 2 rounds")
    args = parser.parse_args()
    n, rounds = (10_000, 2) if args.quick else (args.rows, args.rounds)
    made = files(rows(n))
    seconds: dict[str, dict[str, float]] = {}
    for name, (suffix, content) in made.items():
        assert bounded(suffix, content) == plain(name, content) == n
        best = {"bounded": float("inf"), "plain": float("inf")}
        for _ in range(rounds):
            best["bounded"] = min(best["bounded"], timed(lambda: bounded(suffix, content)))  # noqa: B023
            best["plain"] = min(best["plain"], timed(lambda: plain(name, content)))  # noqa: B023
        seconds[name] = {key: round(value, 3) for key, value in best.items()}
        print(f"{name}: {len(content) / 1e6:.1f} MB, bounded {best['bounded']:.3f} s, plain {best['plain']:.3f} s")
    suffix, content = made["json"]
    array_peak = {"bounded": peak(lambda: bounded(suffix, content)), "plain": peak(lambda: plain("json", content))}
    ratio = {name: round(times["bounded"] / times["plain"], 2) for name, times in seconds.items()}
    print(json.dumps({
        "rows": n, "megabytes": {name: round(len(content) / 1e6, 1) for name, (_, content) in made.items()},
        "seconds": seconds, "ratio": ratio, "array_peak_bytes": array_peak,
        "array_peak_ratio": round(array_peak["plain"] / array_peak["bounded"], 1),
        "target_met": all(value <= 3 for value in ratio.values()),
    }))


if __name__ == "__main__":
    main()
