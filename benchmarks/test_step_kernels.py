"""benchmarks/tools/step_kernels.py's accounting of a replay's kernels (CUPTI trace events), on made-up events: the
main chain is the first kernel's stream, each of its kernels charged its duration and the idle gap before it; another
stream's kernels are listed apart and leave the main chain's gaps alone."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "tools"))

from step_kernels import account  # noqa: E402


def ev(name, ts, dur, stream):
    return {"name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}


def test_the_main_chain_gaps_and_the_side_stream_apart():
    replay = [ev("void at::native::add_kernel<float>(float*)", 0, 2, 7), ev("resolve_kernel", 3, 4, 7),
              ev("copy_kernel", 4, 10, 9), ev("add_kernel", 9, 1, 7)]
    got = account([replay, replay])
    k = got["kernels"]
    assert k["add_kernel"] == {"calls": 2, "dur_us": 3, "gap_us": 2}          # 0 before the first, 2 before the second
    assert k["resolve_kernel"] == {"calls": 1, "dur_us": 4, "gap_us": 1}
    assert k["side copy_kernel"] == {"calls": 1, "dur_us": 10, "gap_us": 0}
    assert (got["wall_us"], got["main_busy_us"], got["main_idle_us"], got["side_busy_us"]) == (14, 7, 3, 10)


def test_each_copy_is_placed_between_the_moe_layer_before_it_and_the_next_resolve():
    from step_kernels import copy_windows
    replay = [ev("down_kernel", 0, 5, 7), ev("copy_kernel", 8, 20, 9), ev("add_kernel", 6, 10, 7),
              ev("resolve_step_kernel", 18, 2, 7), ev("down_kernel", 30, 5, 7), ev("copy_kernel", 37, 4, 9),
              ev("resolve_step_kernel", 50, 2, 7)]
    got = copy_windows(replay)
    assert got == {"n": 2, "start_after_moe_us": 2.5, "dur_us": 12.0, "before_resolve_us": 7.0}   # (3, 2); (20, 4);
    #                                                                                                 (10, 4)
    assert copy_windows([ev("copy_kernel", 0, 1, 9)])["n"] == 0


def test_kernel_names_lose_their_templates_namespaces_and_arguments():
    from step_kernels import short
    assert short("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, 2>(float*)") == \
        "CatArrayBatchedCopy"
    assert short("void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128>>(Params)") == \
        "flash_fwd_splitkv_kernel"
    assert short("resolve_kernel") == "resolve_kernel"
