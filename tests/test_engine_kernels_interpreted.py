"""The device loop with its kernels, not their references, on the CPU (Triton's interpreter): the glue between the
engine and each kernel (arguments, shapes, dtypes, the order of the calls in a layer) is what a GPU runs, so a
mistake there shows here and not first on the GPU machine. The fused MoE is interpreted too, so logits agree with
the reference loop to float32 rounding (its sums run in another order) and tokens, cache hits, prefetches, staged
reads and bytes agree exactly. (Which staged uses found their expert already read and which waited for it, and how
many guesses the stager read or saw before their layer asked, depend on the stager thread's timing: their sums
agree.)"""
from __future__ import annotations

import pytest
import torch

from strata_plan.kernels import lru, prefetch, stage_wait
from strata_plan.kernels.triton_common import INTERPRETER_OK

from test_engine_run import _one_thread, bf16_plan, packed_bf16, run  # noqa: F401,F811

pytestmark = pytest.mark.skipif(torch.cuda.is_available() or not INTERPRETER_OK,
                                reason="the interpreter stands in for a GPU here (on a GPU the kernels run anyway)")


def counted(c: dict) -> dict:
    """The counts that do not depend on the stager thread's timing."""
    kinds = dict(c["by_kind"])
    kinds["staged"] = kinds.pop("staged", 0) + kinds.pop("demand")     # read from staging, waited for or not
    out = {"by_kind": kinds, "ram": c["bytes_from"]["ram"], "staged_bytes": c.get("staged_bytes")}
    if not c["bytes_from"].get("nvme"):       # (the stager counts guesses in the rows its poller saw)
        out.update(prefetch_bytes=c["prefetch_bytes"], wasted_bytes=c["wasted_bytes"], lookahead=c.get("lookahead"))
    return out


@pytest.mark.parametrize("split,mode", [((4, 28, 2, 0), "lru"),          # device LRU: step and fill
                                        ((4, 28, 2, 2), "plan"),         # + lookahead: claim, copy, resolve
                                        ((4, 10, 2, 1), "plan")])        # + the NVMe tier: stage_wait, stage_done
def test_the_kernels_give_the_references_tokens_and_counts(packed_bf16, split, mode, monkeypatch):
    plan = bf16_plan(*split, chunk=1)
    ref = run(packed_bf16, plan, mode, new=4, backend="torch")
    launched: dict[str, int] = {}
    for mod, name in ((lru, "lru_step"), (lru, "fill_slots"), (prefetch, "claim"), (prefetch, "resolve_step"),
                      (stage_wait, "stage_wait"), (stage_wait, "stage_done")):
        def spy(*a, _f=getattr(mod, name), _n=name, **k):
            launched[_n] = launched.get(_n, 0) + 1
            return _f(*a, **k)
        monkeypatch.setattr(mod, name, spy)
    got = run(packed_bf16, plan, mode, new=4, backend="triton")
    want = {"fill_slots"} | ({"claim", "resolve_step"} if mode == "plan" else {"lru_step"}) \
        | ({"stage_wait", "stage_done"} if split[1] < 28 else set())
    assert set(launched) == want, launched
    assert got[1] == ref[1]
    torch.testing.assert_close(got[0], ref[0], rtol=1e-4, atol=1e-4 * float(ref[0].abs().max()))
    assert counted(got[2]) == counted(ref[2])
    kinds = ref[2]["by_kind"]
    assert kinds["cached"] > 0 and (mode == "lru" or kinds["prefetched"] + kinds.get("staged", 0) > 0)
