"""The benchmarks' result files: `strata_plan.results` (which `strata-plan bench --results` writes through too),
into benchmarks/results/ unless a script is given --out-dir."""
from __future__ import annotations

import faulthandler
import sys
import traceback
from pathlib import Path

from strata_plan import results

RESULTS = Path(__file__).resolve().parent / "results"
git_sha, machine = results.git_sha, results.machine


def result_path(benchmark: str, out_dir=None) -> Path:
    """Where `write_result(..., path=)` rewrites a result saved as the benchmark goes."""
    return results.result_path(benchmark, out_dir or RESULTS)


def write_result(benchmark: str, metrics: dict, command: str | None = None, notes: str = "", out_dir=None,
                 extra: dict | None = None, path=None) -> Path:
    """`strata_plan.results.write_result` into `out_dir`, benchmarks/results/ when None (or `path`)."""
    return results.write_result(benchmark, metrics, out_dir or RESULTS, command=command, notes=notes, extra=extra,
                                path=path)


def on_timeout(signum, frame) -> None:
    """SIGTERM (`timeout`): every thread's stack on stderr (where a run hung), then SystemExit(124), so the
    benchmark's `finally` still writes what was measured."""
    faulthandler.dump_traceback(all_threads=True)
    sys.exit(124)


def record_failure(errors: list[str], what: str, err: BaseException) -> None:
    """A run that raised: its traceback on stderr, one line (`what: Type: first line`) into `errors` and printed, so a
    benchmark writes the runs that worked and says which did not."""
    traceback.print_exc()
    errors.append(f"{what}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
    print(f"FAILED {errors[-1]}", flush=True)


def stager_latency(st: dict) -> dict:
    """The NVMe stager's host side of a demand read (a run's `stager` counters, `engine.stager`), as metrics: the
    demand reads a token, the mean time from the poller seeing a request to a reader taking it and from there to
    the ready word, and of that until the host saw its last part in (`land`: the drive's part), the queue time also
    by the read's rank within its request (first taken, second, ..), and the poller's gap before each look that
    found a request (mean, longest). Beside the GPU's wait a token (`stage_wait`), they say which side a wait is
    spent on. Where the lookahead's reads go, a token: queued,
    dropped as stale or for want of a slot, and routed uses that found their read still running."""
    return {"demand_reads_per_token_measured": st["demand_reads_per_token"],
            "stager_queue_ms_measured": st["demand_queue_ms_mean"],
            "stager_read_ms_measured": st["demand_read_ms_mean"],
            "stager_land_ms_measured": st.get("demand_land_ms_mean", float("nan")),
            **{f"stager_queue_ms_rank{k}_measured": v for k, v in enumerate(st.get("demand_queue_ms_by_rank", []))},
            "stager_poll_gap_ms_mean_measured": st["poll_gap_ms_mean"],
            "stager_poll_gap_ms_max_measured": st["poll_gap_ms_max"],
            **{f"stager_{k}_per_token_measured": st[k] / st["tokens"]
               for k in ("guess_queued", "guess_stale", "guess_no_slot", "found_reading")}}
