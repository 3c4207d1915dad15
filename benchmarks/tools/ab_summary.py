"""Medians over the rounds of benchmarks/tools/ab_kernels.sh: python benchmarks/tools/ab_summary.py OUT_DIR"""
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def main(out: str) -> None:
    runs = defaultdict(list)                       # tree name -> metrics of each round
    for f in sorted(Path(out).glob("*-*/ab-*.json")):
        runs[f.parent.name.rsplit("-", 1)[0]].append(json.loads(f.read_text())["metrics"])
    rows = defaultdict(dict)
    for tree, ms in runs.items():
        for key in ms[0]:
            if key.startswith("moe_"):
                for part in ("graph_us_per_layer", "gate_up_us", "down_us"):
                    rows[f"{key} {part}"][tree] = [m[key]["best"][part] for m in ms]
            elif key.startswith("gemv_single"):
                for shape, v in ms[0][key].items():
                    if isinstance(v, dict) and "us" in v:
                        rows[f"gemv {shape} us"][tree] = [m[key][shape]["us"] for m in ms]
    trees = list(runs)
    print("metric".ljust(44) + "".join(t.rjust(22) for t in trees))
    for name, per in rows.items():
        print(name.ljust(44) + "".join(
            (f"{statistics.median(per[t]):.2f} ({min(per[t]):.1f}-{max(per[t]):.1f})" if t in per else "-").rjust(22)
            for t in trees))
    Path(out, "ab_summary.json").write_text(json.dumps(
        {n: {t: {"median": statistics.median(v), "all": v} for t, v in per.items()} for n, per in rows.items()}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
