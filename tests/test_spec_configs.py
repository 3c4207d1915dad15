"""The README's list of shared configs that load or are refused matches what the reader does."""
from __future__ import annotations

import re
from pathlib import Path

from strata_plan.core.spec import scan_configs

ROOT = Path(__file__).resolve().parents[1]


def readme_rows() -> dict[str, str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- config-support:start -->")[1].split("<!-- config-support:end -->")[0]
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| `([^`]+)` \| (loads|refused) \|", block, re.M)}


def test_readme_config_list_matches_reader(shared_data):
    actual = {rel: result for rel, result, _ in scan_configs(shared_data / "configs")}
    assert readme_rows() == actual
