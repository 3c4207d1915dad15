"""The benchmarks' result files: `strata_plan.results` (which `strata-plan bench` writes through too)."""
from strata_plan.results import RESULTS, git_sha, machine, write_result  # noqa: F401
