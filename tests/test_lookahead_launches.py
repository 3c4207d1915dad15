"""The device loop's lookahead launches what `core.lookahead` says (`GATE_LAUNCHES`, `ISSUE_LAUNCHES`,
`LAYER_LAUNCHES`, which the cost model charges by stream): counted here on the fixture (the DeepSeek-V3 family's
router), one eager decode step with every kernel launched (interpreted on a CPU), against the same plan without
lookahead, the side stream's claim and copy left out. A change to the lookahead's path that launches more or
fewer kernels fails here until the constants say so."""
from __future__ import annotations

import pytest
import torch

from strata_plan.core.lookahead import GATE_LAUNCHES, ISSUE_LAUNCHES, LAYER_LAUNCHES
from strata_plan.engine.launches import decode_step_launches
from strata_plan.kernels.triton_common import INTERPRETER_OK

from test_engine_run import _one_thread, bf16_plan, packed_bf16  # noqa: F401,F811

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() and not INTERPRETER_OK,
                                reason="Triton launches are counted compiled or interpreted")
SIDE = ("claim_kernel", "copy_kernel")      # the side stream's, off the main stream


@pytest.mark.parametrize("split", [(4, 28, 2, 1), (4, 28, 2, 2), (4, 10, 2, 2)])   # last: an NVMe tier (every depth)
def test_the_lookahead_launches_what_the_cost_model_charges(packed_bf16, split):  # noqa: F811
    vram, ram, cache, depth = split
    device = "cuda" if torch.cuda.is_available() else "cpu"
    base = decode_step_launches(packed_bf16, bf16_plan(vram, ram, cache, 0, chunk=1), "lru", device)
    got = decode_step_launches(packed_bf16, bf16_plan(vram, ram, cache, depth, chunk=1), "plan", device)
    L = 5                                                   # the fixture's MoE layers
    staged = ram < 28
    issues = sum(j + depth < L for j in range(L))         # VRAM prefetches: depth d's guesses, where layer j+d exists
    gates = sum(min(depth, L - 1 - j) for j in range(L)) if staged else issues
    main_stream = got.total - base.total - sum(got.triton[k] for k in SIDE)
    assert main_stream == gates * GATE_LAUNCHES + issues * ISSUE_LAUNCHES + L * LAYER_LAUNCHES + 1   # + the token's
    #                                                                                                  last release


def test_the_decode_router_runs_in_two_launches_and_routes_as_torch(packed_bf16):  # noqa: F811
    """With the kernels on, a decode token's MoE routers are `kernels.gate` (`Router.fused`: 2 launches a layer
    instead of the torch router's ~12 after the norm): the step launches that many fewer kernels, and the engine's
    decode logits stay the torch router's within float32 summation order (same greedy tokens)."""
    from test_engine_run import run
    device = "cuda" if torch.cuda.is_available() else "cpu"
    plan = bf16_plan(4, 28, 2, 0, chunk=1)
    fused = decode_step_launches(packed_bf16, plan, "lru", device)
    from strata_plan.engine import model as model_mod
    real = model_mod.MoEModel.route_layer
    model_mod.MoEModel.route_layer = lambda self, layer, h, y: layer.router(y)      # the torch router alone
    try:
        torch_router = decode_step_launches(packed_bf16, plan, "lru", device)
        ref_logits, ref_tokens, _ = run(packed_bf16, plan, "lru", device=device, backend="triton")
    finally:
        model_mod.MoEModel.route_layer = real
    L = 5
    assert fused.triton["gate_logits_kernel"] == L and fused.triton["gate_topk_kernel"] == L
    assert torch_router.total - fused.total >= 8 * L
    logits, tokens, _ = run(packed_bf16, plan, "lru", device=device, backend="triton")
    assert tokens == ref_tokens
    torch.testing.assert_close(logits, ref_logits, rtol=1e-3, atol=1e-3)


def test_the_device_loop_step_rotates_in_one_launch_a_head(packed_bf16):  # noqa: F811
    """The device loop's step (the runner the engine installs; its first step eager, every kernel interpreted on a CPU) rotates each
    layer's query and key heads with `kernels.rope`, one launch each, and routes with `kernels.gate`."""
    from strata_plan.engine.engine import Engine, EngineOptions
    from strata_plan.engine.launches import Launches, hook_triton
    hook_triton()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with Engine.open(packed_bf16, bf16_plan(4, 28, 2, 0, chunk=1),
                     EngineOptions(mode="lru", device=device, backend="triton")) as eng:
        m = eng.model
        m.reset()
        m.prefill([5, 17, 99], chunk=1)
        with Launches() as got:                                 # the first step runs eagerly (a GPU captures the
            m.decode_step(3, greedy=True)                       # second and replays after: nothing to count)
        if device != "cpu":
            torch.cuda.synchronize()
    n_layers, L = 6, 5
    assert got.triton["rope_kernel"] == 2 * n_layers and got.triton["gate_logits_kernel"] == L
    assert got.torch["sub"] == 0                              # no torch rotation left (x1 cos - x2 sin)
