"""Which call breaks a CUDA graph capture: the engine's decode step captured with a profile hook that checks, after
every Python and C function return inside the capture, that the capturing stream is still capturing; the first
return after which it is not names the call that invalidated it (with its stack).

    python3 benchmarks/tools/capture_probe.py            # the streamed-dense cases of tests/test_engine_run.py

A debugging tool for a GPU machine (no results JSON): prints one line a case, and the culprit's stack if any."""
from __future__ import annotations

import sys
import tempfile
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import test_engine_run as T  # noqa: E402  (the tests' plans and run helper)

from strata_plan.engine import device_loop  # noqa: E402

state = {"on": False, "culprit": None}


def hook(frame, event, arg):
    if not state["on"] or state["culprit"] is not None or event not in ("return", "c_return"):
        return
    if not torch.cuda.is_current_stream_capturing():
        what = getattr(arg, "__qualname__", repr(arg)) if event == "c_return" else frame.f_code.co_qualname
        stack = "".join(traceback.format_stack(frame, limit=12))
        state["culprit"] = f"after {event} of {what} ({frame.f_code.co_filename}:{frame.f_lineno})\n{stack}"


_work = device_loop.DeviceDecode._work


def probed_work(self, pick, n):
    if not torch.cuda.is_current_stream_capturing():
        return _work(self, pick, n)
    state["on"], state["culprit"] = True, None
    sys.setprofile(hook)
    try:
        return _work(self, pick, n)
    finally:
        sys.setprofile(None)
        state["on"] = False


def main() -> int:
    if not torch.cuda.is_available():
        print("capture_probe: needs a CUDA GPU")
        return 2
    device_loop.DeviceDecode._work = probed_work
    from strata_plan.cli import main as cli
    out = Path(tempfile.mkdtemp()) / "packed"
    assert cli(["pack", str(T.FIXTURE), "--out", str(out), "--format", "bf16", "--json"]) == 0
    cases = [((4, 10, 3, 2), "plan", 1), ((4, 10, 3, 2), "lru", 5)]
    for split, mode, chunk in cases:
        base = T.bf16_plan(*split, chunk=chunk)
        for layers, head in [((), "vram")] + T.STREAMS:
            plan = T.streaming(base, layers, head) if (layers or head == "ram") else base
            name = f"{split} {mode} chunk {chunk} streamed {layers} lm_head {head}"
            try:
                T.run(out, plan, mode, new=4, device="cuda")
                print(f"OK    {name}", flush=True)
            except Exception as e:  # noqa: BLE001 (a probe: report and go on)
                print(f"FAIL  {name}: {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
                print(state["culprit"] or "  (no return saw the capture invalidated)", flush=True)
                torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
