"""The decode loop over the tiered store, on the CPU: the committed fixture MoE packed with BF16 experts.

The plan's tiers, its cache and its lookahead change where experts are read from and when, never what is
computed: every mode (plan with prefetch, LRU-only, on-demand) and every tier split gives bit-identical
logits and tokens, and the engine's greedy tokens are transformers' (the model's own tolerance argument is
in test_engine_models.py)."""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import weakref
from pathlib import Path

import pytest
import torch

from strata_plan.engine.engine import Engine, EngineOptions
from strata_plan.errors import UserError
from strata_plan.core.plan import CachePlan, DensePlan, load_plan

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "fixture-moe"
PROMPT = [5, 17, 99, 3, 250, 1024, 7, 7, 42, 311, 12, 8]


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


@pytest.fixture(scope="module")
def packed_bf16(tmp_path_factory):
    from strata_plan.cli import main
    out = tmp_path_factory.mktemp("fx") / "packed"
    assert main(["pack", str(FIXTURE), "--out", str(out), "--format", "bf16", "--json"]) == 0
    return out


def bf16_plan(vram: int, ram: int, cache: int, depth: int, chunk: int = 5):
    """The fixture's plan with every expert in bf16 (as packed) and, per layer, the `vram` most used static,
    the next `ram` in pinned RAM, the rest on NVMe; `cache` LRU slots; lookahead `depth`."""
    plan = load_plan(FIXTURE / "plan-rtx-4090.yaml")
    layers = []
    for l in plan.layers:
        order = l.vram + l.ram + l.nvme
        layers.append(dataclasses.replace(l, vram=order[:vram], ram=order[vram:vram + ram], nvme=order[vram + ram:],
                                          cache_slots=cache, formats={"bf16": tuple(range(plan.n_experts))}))
    return dataclasses.replace(plan, layers=tuple(layers), prefetch_depth=depth, prefill_chunk=chunk,
                               cache=CachePlan("lru", plan.cache.slot_bytes, cache * len(layers)))


def run(packed, plan, mode: str, new: int = 5, device: str = "cpu", graphs: bool | str = True, backend: str = "auto",
        routed: list | None = None, io: str = "threads"):
    """(prompt logits [V], logits of each decode step, greedy tokens, store counters). graphs: True (the engine's
    step runner, `DeviceDecode`: eager on a CPU), "eager" (the same runner's step run eagerly, also on a GPU), False
    (the model's own forward: with mode on-demand the plain reference loop). backend: EngineOptions.backend ("triton"
    on a CPU: every kernel interpreted). `routed` gets each one-token MoE call's (MoE layer, routed ids) appended, in
    call order. io: EngineOptions.stager_io."""
    with Engine.open(packed, plan, EngineOptions(mode=mode, device=device, graphs=bool(graphs),
                                                 backend=backend, stager_io=io)) as eng:
        m = eng.model
        if graphs == "eager":
            from strata_plan.engine.device_loop import DeviceDecode
            runner = DeviceDecode(m, eng.experts, graphs=False)
            runner.dense_step_bytes = m.step_runner.dense_step_bytes
            m.step_runner = runner
        if routed is not None:
            call = eng.experts.read_in_place

            def spy(j, x, ids, w):
                routed.append((j, ids.reshape(-1).tolist()))
                return call(j, x, ids, w)
            eng.experts.read_in_place = spy
        m.reset()
        logits = [m.prefill(PROMPT, chunk=plan.prefill_chunk)]
        tokens = []
        for _ in range(new):
            tokens.append(int(logits[-1].argmax()))
            logits.append(m.decode_step(tokens[-1]))
        return torch.stack(logits), tokens, eng.store.counter_data()


def blob_bytes(packed) -> int:
    """The bytes of one expert blob of the bf16-packed fixture (every blob the same size)."""
    from strata_plan.engine.packed import load_index
    sizes = {e.nbytes for e in load_index(packed).entries}
    assert len(sizes) == 1
    return sizes.pop()


CASES = [((4, 10, 3, 2), "plan"), ((4, 10, 3, 2), "lru"), ((0, 0, 0, 1), "plan"), ((2, 6, 0, 0), "on-demand")]


def test_one_token_at_a_time_tiers_modes_and_prefetch_give_identical_logits(packed_bf16):
    """Prefill one token a call: every MoE call is the decode step's, whatever the tiers."""
    ref_logits, ref_tokens, _ = run(packed_bf16, bf16_plan(32, 0, 0, 0, chunk=1), "on-demand", new=3)
    for split, mode in CASES:
        logits, tokens, _ = run(packed_bf16, bf16_plan(*split, chunk=1), mode, new=3)
        assert torch.equal(logits, ref_logits), (mode, split)
        assert tokens == ref_tokens


def test_chunked_prefill_in_waves_gives_the_same_tokens(packed_bf16):
    """Prefill chunks run the MoE in waves of resident experts: a token's expert sum is added in partial
    sums whose grouping depends on what was resident, so logits agree to float32 rounding (measured
    ~1e-6 relative), not bit for bit; the tokens are the same."""
    ref_logits, ref_tokens, _ = run(packed_bf16, bf16_plan(32, 0, 0, 0), "on-demand")
    for split, mode in CASES:
        plan = bf16_plan(*split)
        logits, tokens, counters = run(packed_bf16, plan, mode)
        torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5 * float(ref_logits.abs().max()))
        assert tokens == ref_tokens
        assert counters["uses"] == 5 * 5 * plan.top_k          # 5 decode tokens x 5 MoE layers x top-k
        if mode == "plan" and plan.prefetch_depth:
            assert counters["lookahead"]["1"]["guesses"] > 0
        if mode != "plan":
            assert counters["prefetch_bytes"] == 0


def test_the_step_runner_is_the_models_own_forward(packed_bf16):
    """The step runner (`DeviceDecode`, eager on the CPU) attends over the whole masked cache at the device position;
    the plain reference loop (graphs off, on-demand) is the model's own forward with attention over the cached
    prefix. Same arithmetic up to the order of the masked softmax's float32 sums (measured ~1e-6 relative); the same
    tokens, with the cache and the lookahead at work."""
    ref_logits, ref_tokens, _ = run(packed_bf16, bf16_plan(2, 6, 0, 0), "on-demand", graphs=False)
    logits, tokens, counters = run(packed_bf16, bf16_plan(4, 10, 3, 2), "plan")
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5 * float(ref_logits.abs().max()))
    assert tokens == ref_tokens and counters["lookahead"]["1"]["guesses"] > 0
    eager = run(packed_bf16, bf16_plan(4, 10, 3, 2), "plan", graphs="eager")   # (the GPU tests' reference)
    staged = lambda k: k["demand"] + k["staged"]    # noqa: E731  (waited for or not: the stager thread's timing)
    same = ("static", "cached", "prefetched", "late", "in_place")
    assert torch.equal(eager[0], logits) and staged(eager[2]["by_kind"]) == staged(counters["by_kind"])
    assert all(eager[2]["by_kind"][k] == counters["by_kind"][k] for k in same)


@pytest.mark.parametrize("graphs", [True, False])
def test_ram_experts_read_in_place_give_the_resident_logits_and_count_every_byte(packed_bf16, graphs):
    """On-demand, VRAM + RAM: static experts in the arena, the rest read in place from the RAM tier (on the CPU the
    same buffer). The same kernel reads the same bytes as with every expert static, so logits are bit-identical;
    every routed use outside the static set is read in place, one blob's bytes each, counted against the routed ids
    themselves."""
    plan = bf16_plan(4, 28, 0, 0, chunk=1)
    ref = run(packed_bf16, bf16_plan(32, 0, 0, 0, chunk=1), "on-demand", new=5, graphs=graphs)
    routed: list = []
    dev = run(packed_bf16, plan, "on-demand", new=5, graphs=graphs, routed=routed)
    assert torch.equal(dev[0], ref[0]) and dev[1] == ref[1]
    static = [set(l.vram) for l in plan.layers]
    n_static = sum(e in static[j] for j, ids in routed for e in ids)
    d = dev[2]
    assert d["uses"] == (len(PROMPT) + 5) * 5 * plan.top_k == sum(len(ids) for _, ids in routed)
    assert d["by_kind"]["static"] == n_static and d["by_kind"]["in_place"] == d["uses"] - n_static > 0
    assert d["bytes_from"]["ram"] == d["by_kind"]["in_place"] * blob_bytes(packed_bf16)


@pytest.mark.parametrize("graphs", [True, False])
def test_the_device_lru_hits_what_the_planners_lru_hits(packed_bf16, graphs):
    """LRU-only, VRAM + RAM: the plan's LRU decided on the device (kernels.lru, its reference on the CPU), admitted
    experts copied into its slots. Against the routed ids of the run itself, the planner's brute-force LRU
    (`simulate_cache`) gives the same hits layer by layer; every miss crosses PCIe once; logits are the resident
    run's bit for bit (prompt and 12 tokens, so the cache fills and evicts)."""
    import numpy as np

    from strata_plan.core.routing.reference import simulate_cache
    plan = bf16_plan(4, 28, 2, 0, chunk=1)        # prefill a token a call: every call goes through the cache
    ref = run(packed_bf16, bf16_plan(32, 0, 0, 0, chunk=1), "on-demand", new=12, graphs=graphs)
    routed: list = []
    dev = run(packed_bf16, plan, "lru", new=12, graphs=graphs, routed=routed)
    assert torch.equal(dev[0], ref[0]) and dev[1] == ref[1]
    c = dev[2]
    for j, layer in enumerate(plan.layers):
        ids = np.array([r for jj, r in routed if jj == j])                        # [T, k]
        hits = round(simulate_cache(ids, set(layer.vram), layer.cache_slots) * ids.size)
        got = c["layers"][j]["uses"]
        assert got["static"] + got["cached"] == hits, j
    assert c["by_kind"]["cached"] > 0
    assert c["bytes_from"]["ram"] == c["by_kind"]["in_place"] * blob_bytes(packed_bf16)


def bench_runner_and_plain(packed, plan, mode: str) -> tuple[dict, dict]:
    """`bench.measure` of `plan` in `mode` with the same replayed routing (olmoe-like, seed 3): (with the step runner,
    which reads the replay at a device cursor, without it: the model's own forward reading the host's replay)."""
    from strata_plan.engine.bench import measure
    from strata_plan.engine.replay import Replay
    got = []
    for graphs in (True, False):
        replay = Replay.from_prior("olmoe-like", len(plan.layers), plan.n_experts, plan.top_k, tokens=64, seed=3)
        got.append(measure(packed, plan, mode=mode, tokens=6, warmup=3, replay=replay, device="cpu",
                           options=EngineOptions(graphs=graphs)))
    return got[0], got[1]


@pytest.mark.parametrize("mode,cache", [("on-demand", 0), ("lru", 2)])
def test_bench_with_replayed_routing_reads_the_replay_on_the_device(packed_bf16, mode, cache):
    """`bench.measure` with routing replayed: the step reads the replay's rows at a device cursor it advances itself,
    the plain forward from the host's replay: the same rows drive both, so tokens and counts agree."""
    d, e = bench_runner_and_plain(packed_bf16, bf16_plan(4, 28, cache, 0, chunk=1), mode)
    assert d["tokens"] == e["tokens"]
    for kind in ("static", "cached", "in_place"):
        assert d["counters"]["by_kind"][kind] == e["counters"]["by_kind"][kind]
    assert d["bytes_per_token"]["ram"] == e["bytes_per_token"]["ram"] > 0


def test_every_plan_runs(packed_bf16):
    """Caches, lookahead, NVMe tiers: every plan runs in every mode."""
    for split, mode in (((4, 28, 0, 0), "on-demand"), ((4, 28, 2, 0), "lru"), ((4, 10, 2, 1), "plan"),
                        ((4, 28, 2, 1), "plan")):
        _, tokens, c = run(packed_bf16, bf16_plan(*split), mode, new=1)
        assert len(tokens) == 1 and c["uses"] == 5 * 4


@pytest.mark.parametrize("split", [(4, 28, 0, 2), (4, 28, 2, 2), (4, 28, 2, 1)])
def test_lookahead_prefetch_changes_where_misses_are_read_never_the_cache_or_the_logits(packed_bf16, split):
    """Lookahead (VRAM + RAM plans): the gate of layer j+d guesses after layer j, the missing RAM experts are copied
    into VRAM staging slots (kernels.prefetch; on the CPU they land at once). Against LRU-only on the same plan:
    the same logits bit for bit, the same static and cached uses (a prefetched expert joins the cache only when
    used, as a miss would), every LRU-only miss now prefetched, late or read in place, and every byte over PCIe
    either one LRU-only moved or a wasted guess's."""
    plan = bf16_plan(*split, chunk=1)
    lru_run = run(packed_bf16, plan, "lru", new=12)
    dev = run(packed_bf16, plan, "plan", new=12)
    assert torch.equal(dev[0], lru_run[0]) and dev[1] == lru_run[1]
    h, d = lru_run[2], dev[2]
    for kind in ("static", "cached"):
        assert d["by_kind"][kind] == h["by_kind"][kind], kind
    assert d["by_kind"]["prefetched"] > 0
    assert d["by_kind"]["in_place"] + d["by_kind"]["prefetched"] + d["by_kind"]["late"] == h["by_kind"]["in_place"]
    assert d["bytes_from"]["ram"] == h["bytes_from"]["ram"] + d["wasted_bytes"]
    depth = str(plan.prefetch_depth)
    assert d["lookahead"][depth]["guesses"] > 0


def test_a_late_guess_served_in_part_gives_lru_onlys_logits(packed_bf16, monkeypatch):
    """Partial landing through the engine (the CPU's references): every lookahead copy is cut short after its first
    4 KiB chunk, the rest of its slot junk, and its guess taken when its layer runs (the copy then over, as the copy
    kernel's skipped items leave it): the LRU's fill reads the landed 4 KiB from the staging slot and the rest from
    RAM, so the logits are LRU-only's bit for bit; such uses are counted `partial`, none `prefetched`."""
    from strata_plan.kernels import prefetch as pk
    monkeypatch.setattr(pk, "COPY_CHUNK", 4096)
    real_resolve = pk.reference_resolve

    def cut_copy(arena, gids, jj, st):
        E = st.table.shape[1]
        for i, e in enumerate(int(x) for x in gids.reshape(-1).tolist()):
            s = int(st.assign[i])
            if s < 0 or int(st.state[s]) != pk._word(jj * E + e, pk.FILLING):
                continue
            a, b, n = int(st.ram_rows[jj, e]), int(st.slot_offset[s]), int(st.nbytes[jj, e])
            arena[b:b + n] = 0xFF                                   # junk past the landed chunk
            arena[b:b + 4096] = arena[a:a + 4096]
            st.filled[s] += 4096
            st.counts[jj, pk.COPIED] += 4096
            st.landed[s, 0] = 1

    def resolve_then_copies_over(ids, j, st):
        real_resolve(ids, j, st)
        for s in range(st.state.numel()):
            w = int(st.state[s])
            if w % 8 == pk.TAKEN:
                st.state[s] = w - pk.TAKEN + pk.TAKEN_DONE

    monkeypatch.setattr(pk, "reference_copy", cut_copy)
    monkeypatch.setattr(pk, "reference_resolve", resolve_then_copies_over)
    plan = bf16_plan(4, 28, 2, 1, chunk=1)
    lru_run = run(packed_bf16, plan, "lru", new=8)
    dev = run(packed_bf16, plan, "plan", new=8)
    assert torch.equal(dev[0], lru_run[0]) and dev[1] == lru_run[1]
    kinds = dev[2]["by_kind"]
    assert kinds["partial"] > 0 and kinds["prefetched"] == 0
    assert kinds["in_place"] + kinds["partial"] + kinds["late"] == lru_run[2]["by_kind"]["in_place"]


@pytest.mark.parametrize("split,mode", [((4, 28, 2, 1), "plan"), ((4, 28, 2, 0), "lru")])
def test_a_block_of_steps_in_one_launch_is_the_same_steps_one_by_one(packed_bf16, split, mode):
    """`decode_block` (the runner's steps chained in one launch, each fed the last one's pick): the tokens, the
    position and every counter of the same steps run one launch each, with the cache and the lookahead at work."""
    plan = bf16_plan(*split, chunk=4)
    got = []
    for n in (1, 3):
        with Engine.open(packed_bf16, plan, EngineOptions(mode=mode, device="cpu", tokens_per_graph=3)) as eng:
            m = eng.model
            assert m.step_runner.blocks and m.step_runner.k == 3
            m.reset()
            tok = m.prefill(PROMPT, chunk=plan.prefill_chunk).argmax().reshape(1)
            ids = []
            for _ in range(9 // n):
                out = m.decode_block(tok[-1:], n, greedy=True)
                ids += out.tolist()
                tok = out
            got.append((ids, m.pos, eng.store.counter_data()))
    (one, pos1, c1), (three, pos3, c3) = got
    assert one == three and pos1 == pos3 == len(PROMPT) + 9
    for key in ("uses", "by_kind", "bytes_from", "dense_bytes", "prefetch_bytes", "wasted_bytes", "lookahead"):
        assert c1.get(key) == c3.get(key), key


@pytest.mark.gpu
def test_on_a_gpu_the_graph_gives_the_eager_steps_tokens(packed_bf16):
    """On a GPU: decode steps replayed from CUDA graphs (captured at the second step; RAM experts read over PCIe from
    the registered RAM tier, the device LRU and its fill, the lookahead's side stream) give the eager steps' tokens
    and logits to bf16 rounding, and the same routed bytes from RAM. Each step's logits are kept: a runner that
    returned the graph's output buffer itself (overwritten by the next replay) fails here."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    for split, mode in [((4, 28, 0, 0), "on-demand"), ((4, 28, 2, 0), "lru")] + CASES:
        plan = bf16_plan(*split, chunk=1)
        try:                                   # a failure names its case (a capture error does not otherwise)
            eager, eager_tokens, ec = run(packed_bf16, plan, mode, new=12, device="cuda", graphs="eager")
            dev, tokens, dc = run(packed_bf16, plan, mode, new=12, device="cuda")
        except Exception as e:
            raise AssertionError(f"case {split} {mode}: {type(e).__name__}: {e}") from e
        case = (split, mode)
        assert tokens == eager_tokens, case
        torch.testing.assert_close(dev, eager, rtol=0, atol=2 ** -7 * float(eager.abs().max()), msg=str(case))
        if mode != "plan":                     # (a guess landing late or in time depends on the timing)
            assert dc["bytes_from"]["ram"] == ec["bytes_from"]["ram"], case
            assert dc["by_kind"]["cached"] == ec["by_kind"]["cached"], case
        elif split[1]:                         # the lookahead copies RAM experts (an all-NVMe plan has none)
            assert dc["by_kind"]["prefetched"] + dc["by_kind"]["late"] > 0, case
    with Engine.open(packed_bf16, plan, EngineOptions(mode=mode, device="cuda", tokens_per_graph=4)) as eng:
        assert eng.model.step_runner.ahead          # generate runs ahead, 4 tokens a launch: the prefill's, then
        for _ in range(2):                          # launches of 4, 4 and 3 tokens (eager, captured, eager; replayed
            assert eng.generate(PROMPT, max_new_tokens=12) == eager_tokens[:12]     # the second time)
        assert "greedyx4" in eng.model.step_runner._graphs


def test_sampled_generation_in_the_device_loop_repeats_with_its_seed(packed_bf16):
    """Sampling is drawn inside the step (`GumbelPick`): the same seed gives the same text, another seed (almost
    surely) another."""
    from strata_plan.engine.generate import Sampling
    plan = bf16_plan(4, 28, 2, 1, chunk=4)
    runs = []
    for seed in (5, 5, 6):
        with Engine.open(packed_bf16, plan, EngineOptions(device="cpu")) as eng:
            assert eng.model.step_runner.picks
            runs.append(eng.generate(PROMPT, 12, Sampling(temperature=1.5, seed=seed)))
            assert eng.generate(PROMPT, 12, Sampling(temperature=1.5, seed=seed)) == runs[-1]    # the same engine
    assert runs[0] == runs[1] != runs[2]


@pytest.mark.gpu
def test_on_a_gpu_sampling_is_drawn_inside_the_graph_and_repeats_with_its_seed(packed_bf16):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from strata_plan.engine.generate import Sampling
    with Engine.open(packed_bf16, bf16_plan(4, 28, 2, 1, chunk=4), EngineOptions(device="cuda")) as eng:
        runs = [eng.generate(PROMPT, 12, Sampling(temperature=1.5, top_p=0.9, seed=5)) for _ in range(2)]
        assert any(k.startswith("sample:") for k in eng.model.step_runner._graphs)     # captured, replayed
    assert runs[0] == runs[1]


def test_greedy_tokens_are_transformers(packed_bf16):
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoModelForCausalLM.from_pretrained(FIXTURE, dtype=torch.float32).eval()
    with torch.no_grad():
        want = ref.generate(torch.tensor([PROMPT]), max_new_tokens=6, do_sample=False, use_cache=True)[0, len(PROMPT):]
    with Engine.open(packed_bf16, bf16_plan(3, 9, 2, 2), EngineOptions(device="cpu")) as eng:
        got = eng.generate(PROMPT, max_new_tokens=6)
    assert got == want.tolist()


def test_user_mistakes_are_one_line(packed_bf16, tmp_path):
    plan = bf16_plan(32, 0, 0, 0)
    with pytest.raises(UserError, match="formats"):
        Engine.open(packed_bf16, load_plan(FIXTURE / "plan-rtx-4090.yaml"), EngineOptions(device="cpu"))
    with Engine.open(packed_bf16, plan, EngineOptions(device="cpu")) as eng:
        with pytest.raises(UserError, match="exceed the context"):
            eng.generate(PROMPT * 700, max_new_tokens=4)
        with pytest.raises(UserError, match="max-tokens"):
            eng.generate(PROMPT, max_new_tokens=0)
    with pytest.raises(UserError, match="--mode"):
        EngineOptions(mode="fast")


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    from strata_plan.core.plan import save_plan
    path = tmp_path_factory.mktemp("plans") / "plan.yaml"
    save_plan(dataclasses.replace(bf16_plan(4, 10, 3, 2), context=64), path)
    return path


def test_run_and_bench_commands(packed_bf16, plan_file, tmp_path, capsys):
    from strata_plan.cli import main
    import json
    assert main(["run", "--packed", str(packed_bf16), "--plan", str(plan_file), "--prompt", "def main():",
                 "--max-tokens", "5", "--device", "cpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["ids"]) == 5 and out["counters"]["uses"] > 0
    assert main(["bench", "--packed", str(packed_bf16), "--plan", str(plan_file), "--tokens", "3", "--warmup", "2",
                 "--device", "cpu", "--replay", "olmoe-like", "--results", str(tmp_path), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["measured"]["decode_tok_s"] > 0 and r["counters"]["uses"] == 3 * 5 * 4
    assert r["replay"].startswith("prior olmoe-like") and list(tmp_path.glob("bench-*.json"))
    bt = r["bytes_per_token"]
    assert bt["pcie"] == bt["ram"] + bt["staged"] > 0
    assert main(["bench", "--packed", str(packed_bf16), "--plan", str(plan_file), "--tokens", "3", "--warmup", "2",
                 "--device", "cpu", "--temperature", "0.8", "--top-p", "0.9", "--seed", "2", "--json"]) == 0
    sampled = json.loads(capsys.readouterr().out)
    assert sampled["pick"] == "sample:0.8:0.9:2"
    assert sampled["predicted"]["source"].endswith(", sampled")    # the draw's GPU time counted (the profile's pick_us)


def test_run_reads_the_nvme_tier_through_native_aio_when_asked(packed_bf16, plan_file, capsys):
    """`run --stager-io aio` (the plan has an NVMe tier): the same tokens as the reader threads."""
    from strata_plan.cli import main
    from strata_plan.engine import aio
    import json
    if not aio.available():
        pytest.skip("no Linux native AIO here")
    got = {}
    for io in ("threads", "aio"):
        assert main(["run", "--packed", str(packed_bf16), "--plan", str(plan_file), "--prompt", "def main():",
                     "--max-tokens", "5", "--device", "cpu", "--stager-io", io, "--json"]) == 0
        got[io] = json.loads(capsys.readouterr().out)["ids"]
    assert got["aio"] == got["threads"] and len(got["aio"]) == 5


@pytest.mark.parametrize("extra,field", [(["--max-tokens", "0"], "--max-tokens"),
                                        (["--prompt", "x" * 400], "exceed the context"),
                                        (["--max-tokens", "100000"], "context of 64 tokens (the plan's context; "
                                                                     "the model has 1024 positions)"),
                                        (["--tokens-per-graph", "0"], "--tokens-per-graph"),
                                        (["--mode", "fast"], "--mode"), (["--stager-io", "uring"], "--stager-io")])
def test_run_mistakes_exit_2_in_one_line(packed_bf16, plan_file, capsys, extra, field):
    from strata_plan.cli import main
    args = ["run", "--packed", str(packed_bf16), "--plan", str(plan_file), "--prompt", "hi", "--device", "cpu"]
    with pytest.raises(SystemExit) if extra[0] in ("--mode", "--stager-io") else contextlib.nullcontext():
        assert main(args + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0]


def test_a_plan_for_other_formats_is_refused_naming_the_plan(packed_bf16, capsys):
    from strata_plan.cli import main
    plan = FIXTURE / "plan-rtx-4090.yaml"
    assert main(["run", "--packed", str(packed_bf16), "--plan", str(plan), "--prompt", "hi", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(plan) in err[0] and "formats" in err[0]



# ---- dense weights streamed from pinned RAM (strata_plan/engine/dense.py) --------------------------------------------
def streaming(plan, layers, lm_head: str = "ram", buffers: int = 2):
    """The plan with decoder `layers` streamed from pinned RAM through `buffers` device buffers."""
    n = len(plan.dense.resident_layers) + len(plan.dense.streamed_layers)
    dense = DensePlan(tuple(i for i in range(n) if i not in layers), tuple(layers), lm_head)
    return dataclasses.replace(plan, dense=dense, staging=dataclasses.replace(plan.staging, dense_buffers=buffers))


# (streamed layers, lm_head): 4 units (2 a buffer), 7 units (an odd count: the next token's first layer
# lands in the buffer the lm_head used), one unit, and the lm_head alone
STREAMS = [((0, 2, 3), "ram"), ((0, 1, 2, 3, 4, 5), "ram"), ((4,), "vram"), ((), "ram")]


@pytest.mark.parametrize("layers,head", STREAMS)
def test_streamed_dense_weights_give_the_resident_logits_bit_for_bit(packed_bf16, layers, head):
    """Streaming changes where dense weights are read from, never what is computed: one token a call and in chunks
    (same tiers, so the same waves), with and without lookahead (routers kept resident). The kernels read them in
    place (no copies) in the step, as the resident plan's step; through the copy buffers (`DenseStream(in_place=
    False)`, the fallback for a torch without device views) test_engine_models holds them to the resident model."""
    for split, mode, chunk in [((4, 10, 3, 2), "plan", 1), ((2, 6, 0, 0), "on-demand", 5), ((4, 10, 3, 2), "lru", 5)]:
        plan = bf16_plan(*split, chunk=chunk)
        ref_logits, ref_tokens, _ = run(packed_bf16, plan, mode, new=4)
        logits, tokens, counters = run(packed_bf16, streaming(plan, layers, head), mode, new=4)
        assert torch.equal(logits, ref_logits), (layers, head, mode, chunk)
        assert tokens == ref_tokens
        assert counters["dense_bytes"]["layers"] > 0 if layers else counters["dense_bytes"]["layers"] == 0
        assert counters["dense_demand"] == 0


def _checkpoint_bytes(prefix: str, elem: int) -> int:
    from safetensors import safe_open
    with safe_open(str(FIXTURE / "model.safetensors"), "pt") as f:
        return sum(elem * f.get_slice(k).get_shape()[0] * (f.get_slice(k).get_shape() + [1])[1]
                   for k in f.keys() if k.startswith(prefix) and ".experts." not in k)


def test_dense_bytes_counted_per_token_are_the_streamed_layers(packed_bf16):
    """Counted per decode token: the checkpoint's tensors of each streamed layer (float32 on the CPU; MLA's
    halves of kv_b_proj are refilled on the device, not copied), the lm_head and one embedding row; every
    layer copy was prefetched (issued before its layer started)."""
    layers, n = (0, 2, 3), 3
    plan = streaming(bf16_plan(4, 10, 3, 2), layers)
    with Engine.open(packed_bf16, plan, EngineOptions(mode="lru", device="cpu")) as eng:
        m, store = eng.model, eng.store
        m.reset()
        tok = m.prefill(PROMPT, chunk=plan.prefill_chunk).argmax()
        from strata_plan.engine.counters import StoreCounters
        store.counters = StoreCounters(store.n_layers)
        for _ in range(n):
            tok = m.decode_step(tok).argmax()
        got = store.counters.to_data()
    H, V = m.cfg.hidden, m.cfg.vocab
    want = sum(_checkpoint_bytes(f"model.layers.{i}.", 4) for i in layers)
    assert got["dense_bytes"] == {"layers": n * want, "lm_head": n * V * H * 4, "embeddings": n * H * 4}
    assert got["dense_demand"] == 0


def test_a_plan_streaming_dense_weights_without_buffers_is_one_line(packed_bf16, tmp_path, capsys):
    from strata_plan.cli import main
    from strata_plan.core.plan import save_plan
    for plan, field in [(streaming(bf16_plan(4, 10, 3, 2), (1, 2), buffers=0), "staging.dense_buffers"),
                        (streaming(bf16_plan(4, 10, 3, 2), (9,)), "dense.streamed_layers")]:
        path = tmp_path / "plan.yaml"
        save_plan(plan, path)
        args = ["run", "--packed", str(packed_bf16), "--plan", str(path), "--prompt", "hi", "--device", "cpu"]
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and field in err[0] and str(path) in err[0]


def _closed_engine_refs(packed, plan, device: str) -> tuple[list, dict]:
    """Whether an engine's parts (model, store, experts, dense stream, stager, step runner) are alive once it is
    closed and dropped, with the garbage collector off; and its step runner's graphs (the dict, kept)."""
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        with Engine.open(packed, plan, EngineOptions(device=device)) as eng:
            eng.generate(PROMPT, max_new_tokens=3)
            graphs = eng.model.step_runner._graphs
            parts = [eng.model, eng.store, eng.experts, eng.dense, eng.store.staging.stager, eng.model.step_runner]
            refs = [weakref.ref(o) for o in parts]
            del parts
        del eng
        return [r() is not None for r in refs], graphs
    finally:
        if collecting:
            gc.enable()


def test_a_closed_engine_is_freed_by_its_last_reference_not_by_the_collector(packed_bf16):
    """Closing leaves no reference cycle (the dense stream's hooks on the model, the lookahead's on the experts, the
    step runner): left to the garbage collector, an engine's finalizers (a CUDA graph's pool, a registered region)
    would run in whichever thread set a collection off, maybe a later engine's stager while that engine's GPU waits
    for it. Streamed dense weights, a RAM and an NVMe tier, cache slots, lookahead."""
    alive, _ = _closed_engine_refs(packed_bf16, streaming(bf16_plan(2, 4, 2, 1, chunk=4), (0, 2), "ram"), "cpu")
    assert alive == [False] * 6


@pytest.mark.gpu
def test_on_a_gpu_closing_an_engine_releases_its_graphs_and_regions(packed_bf16):
    """The same on CUDA, where the step's graphs are captured and the tiers are registered regions: after close the
    graphs are released (in the closing thread) and nothing of the engine outlives its last reference."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    alive, graphs = _closed_engine_refs(packed_bf16, streaming(bf16_plan(2, 4, 2, 1, chunk=4), (0, 2), "ram"),
                                        "cuda")
    assert alive == [False] * 6 and graphs == {}


@pytest.mark.gpu
def test_on_the_gpu_streamed_dense_weights_give_the_resident_logits(packed_bf16):
    """The CPU comparison above on CUDA (bf16, Triton fused MoE): the streamed tensors read in place over PCIe inside
    the token's graph (device tensors over pinned RAM), against the resident plan's graph, to bf16 rounding."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    for split, mode, chunk in [((4, 10, 3, 2), "plan", 1), ((4, 10, 3, 2), "lru", 5)]:
        plan = bf16_plan(*split, chunk=chunk)
        dev_logits, dev_tokens, _ = run(packed_bf16, plan, mode, new=8, device="cuda")
        for layers, head in STREAMS:
            try:                               # a failure names its case (a capture error does not otherwise)
                logits, tokens, c = run(packed_bf16, streaming(plan, layers, head), mode, new=8, device="cuda")
            except Exception as e:
                raise AssertionError(f"case {split} {mode} streaming {layers} {head}: {type(e).__name__}: {e}") from e
            torch.testing.assert_close(logits, dev_logits, rtol=0, atol=2 ** -7 * float(dev_logits.abs().max()))
            assert tokens == dev_tokens and c["dense_demand"] == 0
            assert c["dense_bytes"]["lm_head"] > 0 if head == "ram" else c["dense_bytes"]["lm_head"] == 0


@pytest.fixture(scope="module")
def packed_tied(packed_bf16, tmp_path_factory):
    """The packed fixture with its embeddings tied to the lm_head (config and dense tensors edited)."""
    import json
    import shutil
    from safetensors.torch import load_file, save_file

    from strata_plan.core.spec import load_spec
    from strata_plan.engine.files import part_digests
    out = tmp_path_factory.mktemp("tied") / "packed"
    shutil.copytree(packed_bf16, out)
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    dense = load_file(out / "dense.safetensors")
    del dense["lm_head.weight"]
    save_file(dense, out / "dense.safetensors")
    data = (out / "dense.safetensors").read_bytes()
    index = json.loads((out / "index.json").read_text())
    index.update(dense_nbytes=len(data), dense_parts=part_digests(data, index["part_bytes"]),
                 config_sha256=load_spec(str(out)).config_sha256)     # the edited config is the packed one
    (out / "index.json").write_text(json.dumps(index))
    return out


@pytest.mark.parametrize("layers,head", [((1, 3), "ram"), ((1, 3), "vram")])
def test_tied_embeddings_stream_as_the_lm_head_or_stay_on_the_device(packed_tied, layers, head):
    """A table tied to the lm_head is one tensor: streamed as the lm_head (and gathered on the host from
    the same pinned copy) or, with the lm_head in VRAM, on the device (no host gather)."""
    plan = bf16_plan(4, 10, 3, 2, chunk=5)
    sha = json.loads((packed_tied / "index.json").read_text())["config_sha256"]      # a plan for the tied config
    plan = dataclasses.replace(plan, sources=dataclasses.replace(
        plan.sources, model=dataclasses.replace(plan.sources.model, sha256=sha)))
    ref_logits, ref_tokens, _ = run(packed_tied, plan, "lru", new=3)
    logits, tokens, c = run(packed_tied, streaming(plan, layers, head), "lru", new=3)
    assert torch.equal(logits, ref_logits) and tokens == ref_tokens
    assert (c["dense_bytes"]["embeddings"] > 0) == (head == "ram")
    assert (c["dense_bytes"]["lm_head"] > 0) == (head == "ram")


def test_generate_in_blocks_stops_at_its_end_of_sequence_id_inside_a_block(packed_bf16):
    """`generate` with 4 tokens a launch: the greedy and the sampled tokens of one launch a token, and an end-of-sequence
    id in the middle of a launch ends the text there (the tokens past it, computed, are not handed out)."""
    from strata_plan.engine.generate import Sampling, generate
    plan = bf16_plan(4, 28, 2, 1, chunk=4)
    out = {}
    for k in (1, 4):
        with Engine.open(packed_bf16, plan, EngineOptions(device="cpu", tokens_per_graph=k)) as eng:
            m = eng.model
            out[k] = (generate(m, PROMPT, 11, plan.prefill_chunk, eos_ids=[]),
                      generate(m, PROMPT, 11, plan.prefill_chunk, Sampling(temperature=1.5, seed=3), eos_ids=[]))
            stop = out[k][0][6]                           # the 7th token: inside the second launch of 4
            seen = []
            got = generate(m, PROMPT, 11, plan.prefill_chunk, eos_ids=[stop], on_token=seen.append)
            first = out[k][0].index(stop)
            assert got == seen == out[k][0][:first + 1]
    assert out[1] == out[4] and len(out[4][0]) == 11


@pytest.mark.gpu
def test_on_a_gpu_the_bench_runs_of_one_budget_share_their_prompt_and_tokens(packed_bf16):
    """`bench.measure`'s prompt length does not depend on whether the plan's step chains tokens in a launch: every
    expert static in VRAM (bench_engine's reference run) and a plan with a RAM tier, cache and lookahead get the same
    prompt, so on the same routing they give the same greedy tokens."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from strata_plan.engine.bench import measure
    got = [measure(packed_bf16, dataclasses.replace(p, context=96), mode="plan", tokens=8, warmup=4, device="cuda")
           for p in (bf16_plan(32, 0, 0, 0, chunk=4), bf16_plan(4, 28, 2, 1, chunk=4))]
    assert got[0]["measured"]["prefill_tokens"] == got[1]["measured"]["prefill_tokens"]
    assert got[0]["tokens"] == got[1]["tokens"]


def test_bench_decodes_the_prompt_alone_and_records_the_text_it_decoded(packed_bf16):
    """`bench.measure` decodes after the prompt alone (its warm-up chunk is forgotten first) and records the text
    its decode steps ran on: the prompt, then each step's given token. Greedily, that text is what a fresh
    prefill of the prompt and plain decode steps produce; the counted steps are the last ones."""
    from strata_plan.engine.bench import measure
    plan = bf16_plan(4, 10, 3, 1, chunk=1)
    r = measure(packed_bf16, plan, mode="plan", tokens=4, warmup=3, device="cpu", prompt=PROMPT)
    ctx = r["context"]
    assert ctx["prompt"] == PROMPT and r["measured"]["prefill_tokens"] == len(PROMPT)
    assert len(ctx["fed"]) - ctx["counted_from"] == 4 and ctx["counted_from"] == 3
    assert ctx["fed"][ctx["counted_from"] + 1:] == r["tokens"][:-1]        # each counted step's token given next
    _, tokens, _ = run(packed_bf16, plan, "plan", new=len(ctx["fed"]))
    assert tokens == ctx["fed"]


def test_bench_draws_the_same_sampled_tokens_in_every_mode_and_not_the_greedy_ones(packed_bf16):
    """`bench.measure(pick=GumbelPick(...))`: each run draws from the pick's seed afresh (one pick object passed to
    every run), so the modes' equal logits give equal sampled tokens; they are not the greedy continuation."""
    from strata_plan.engine.bench import measure
    from strata_plan.engine.picks import GumbelPick
    plan = bf16_plan(4, 28, 2, 0, chunk=1)
    pick = GumbelPick(1.0, 0.95, seed=5)
    got = {mode: measure(packed_bf16, plan, mode=mode, tokens=8, warmup=2, device="cpu", pick=pick)
           for mode in ("lru", "on-demand")}
    assert got["lru"]["tokens"] == got["on-demand"]["tokens"] and got["lru"]["pick"] == pick.key
    greedy = measure(packed_bf16, plan, mode="lru", tokens=8, warmup=2, device="cpu")
    assert greedy["pick"] == "greedy" and greedy["tokens"] != got["lru"]["tokens"]


@pytest.mark.gpu
def test_on_a_gpu_a_sampled_bench_times_its_step_parts(packed_bf16):
    """A sampled bench on the device loop ends with `time_parts`, which captures the sampled step outside the decode
    call: the pick's draw counter (made in inference mode) is updated there too."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from strata_plan.engine.bench import measure
    from strata_plan.engine.picks import GumbelPick
    r = measure(packed_bf16, dataclasses.replace(bf16_plan(4, 28, 2, 1, chunk=4), context=96), mode="plan", tokens=8,
                warmup=4, device="cuda", pick=GumbelPick(1.0, 0.95, seed=5))
    assert r["pick"].startswith("sample:") and r["device_step"]["step_s"] > 0
