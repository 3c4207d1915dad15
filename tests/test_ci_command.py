"""CI runs exactly the README's test command (`.ci/run`), so what a newcomer types is what CI checks."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"Run the tests \(this is exactly what CI runs, `\.ci/run`\):\s*```bash\n(.+?)\n```", readme, re.S)
    assert block, "README's test command block moved: keep its sentence and fence"
    command = block.group(1).strip()
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == [command]
    assert "-n auto" in command            # the suite runs on both cores of a CI machine (pytest-xdist)
