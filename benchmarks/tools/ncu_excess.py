"""Which SASS instructions of a kernel waste memory sectors: reads the per-instruction CSV that Nsight
Compute prints with `--section SourceCounters --page source --print-source sass --csv`, and lists the
instructions with the most excessive global sectors (sectors fetched beyond what the addresses need).

    ncu --section SourceCounters --page source --print-source sass --csv -k regex:gate_up_kernel \
        --launch-skip 1 -c 1 python3 benchmarks/tools/ncu_moe.py '{}' > src.csv
    python3 benchmarks/tools/ncu_excess.py src.csv [top N] [stall]

With `stall` it lists the instructions where the sampled warps stalled most instead (the column "Warp
Stall Sampling (All Samples)"), with each one's share of all samples.
"""
from __future__ import annotations

import csv
import sys


def _num(v: str) -> float:
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0


def main() -> None:
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25
    by_stall = len(sys.argv) > 3 and sys.argv[3] == "stall"
    lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith('"') and "Source" in ln)   # the CSV header
    rows = list(csv.reader(lines[start:]))
    head, body = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
    src = next(i for i, h in enumerate(head) if h.strip() == "Source")
    want = [i for i, h in enumerate(head) if "Excessive" in h or "Theoretical Sectors" in h or h.strip()
            in ("Address", "Warp Stall Sampling (All Samples)", "Instructions Executed")]
    print("columns:", [head[i] for i in want])
    if by_stall:
        exc = next(i for i in want if head[i].startswith("Warp Stall Sampling"))
    else:
        exc = next((i for i in want if "Excessive" in head[i] and "Global" in head[i]), want[0])
    total = sum(_num(r[exc]) for r in body)
    print(f"{head[exc]}: {total:.0f} in all")
    for r in sorted(body, key=lambda r: -_num(r[exc]))[:top]:
        share = f"{100 * _num(r[exc]) / total:5.1f}% | " if by_stall and total else ""
        print(share + " | ".join(r[i] for i in want), "|", r[src].strip())


if __name__ == "__main__":
    main()
