"""Print the README's table of which shared HF configs load and which are refused (and why).

Run from the repository root: python scripts/config_support.py [../shared/data/configs]
tests/test_spec_configs.py checks the README's table against what the reader does.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from strata_plan.errors import UserError
from strata_plan.core.spec import spec_from_config


def support_rows(folder: Path) -> list[tuple[str, str, str]]:
    rows = []
    for p in sorted(folder.rglob("*.json")):
        if p.name.startswith("_"):
            continue
        rel = p.relative_to(folder).as_posix()
        try:
            s = spec_from_config(json.loads(p.read_text()), p.stem, rel)
            rows.append((rel, "loads", f"{s.model_type}, {s.total_params / 1e9:.1f}B params, "
                                       f"{s.n_moe_layers} MoE layers x {s.n_routed} experts, top-{s.top_k}"))
        except UserError as e:
            rows.append((rel, "refused", f"{e.field}: {e.problem}"))
    return rows


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/configs")
    print("| config | result | detail |\n|---|---|---|")
    for rel, result, detail in support_rows(folder):
        print(f"| `{rel}` | {result} | {detail} |")


if __name__ == "__main__":
    main()
