"""The decode loop over the tiered store, on the CPU: the committed fixture MoE packed with BF16 experts.

The plan's tiers, its cache and its lookahead change where experts are read from and when, never what is
computed: every mode (plan with prefetch, LRU-only, on-demand) and every tier split gives bit-identical
logits and tokens, and the engine's greedy tokens are transformers' (the model's own tolerance argument is
in test_engine_models.py)."""
from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from strata_plan.engine.engine import Engine, EngineOptions
from strata_plan.engine.graphed import GraphedDecode
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


def run(packed, plan, mode: str, new: int = 5, device: str = "cpu", graphs: bool | str = True, loop: str = "device",
        ran: list | None = None, backend: str = "auto"):
    """(prompt logits [V], logits of each decode step, greedy tokens, store counters). graphs: True (the
    engine's default loop), False (the model's own forward), "eager" (the graphed loop's segments run
    eagerly, also on a GPU). loop: EngineOptions.loop; `ran` gets the loop that ran appended. backend:
    EngineOptions.backend ("triton" on a CPU: every kernel interpreted)."""
    with Engine.open(packed, plan, EngineOptions(mode=mode, device=device, poison=device == "cpu", graphs=bool(graphs),
                                                 loop=loop, backend=backend)) as eng:
        if ran is not None:
            ran.append(eng.loop)
        m = eng.model
        if graphs == "eager":
            m.step_runner = GraphedDecode(m, eng.experts, graphs=False)
        m.reset()
        logits = [m.prefill(PROMPT, chunk=plan.prefill_chunk)]
        tokens = []
        for _ in range(new):
            tokens.append(int(logits[-1].argmax()))
            logits.append(m.decode_step(tokens[-1]))
        return torch.stack(logits), tokens, eng.store.counter_data()


CASES = [((4, 10, 3, 2), "plan"), ((4, 10, 3, 2), "lru"), ((0, 0, 0, 1), "plan"), ((2, 6, 0, 0), "on-demand")]


def test_one_token_at_a_time_tiers_modes_and_prefetch_give_identical_logits(packed_bf16):
    """Prefill one token a call: every MoE call is one `ensure` + one kernel call, whatever the tiers."""
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


def test_the_segmented_decode_loop_is_the_models_own_forward(packed_bf16):
    """engine.graphed runs a token as segments cut at the round trips (on the CPU without graphs), with the
    static attention over the whole masked cache; the plain reference loop (graphs off, on-demand) is the
    model's own forward with attention over the cached prefix. Same arithmetic up to the order of the
    masked softmax's float32 sums (measured ~1e-6 relative); the same tokens."""
    ref_logits, ref_tokens, _ = run(packed_bf16, bf16_plan(2, 6, 0, 0), "on-demand", graphs=False, loop="host")
    logits, tokens, counters = run(packed_bf16, bf16_plan(4, 10, 3, 2), "plan")
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5 * float(ref_logits.abs().max()))
    assert tokens == ref_tokens and counters["lookahead"]["1"]["guesses"] > 0


@pytest.mark.parametrize("graphs", [True, False])
def test_ram_experts_read_in_place_give_the_copying_loops_logits_and_counts(packed_bf16, graphs):
    """The device loop (on-demand, VRAM + RAM: static experts in the arena, the rest read in place from the RAM
    tier, on the CPU the same buffer) against the host loop copying those experts into slots first: the same
    kernel reads the same bytes, so logits are bit-identical, and every routed use the host loop fetched on
    demand the device loop read in place, byte for byte."""
    plan = bf16_plan(4, 28, 0, 0)
    loops: list[str] = []
    host = run(packed_bf16, plan, "on-demand", graphs=graphs, loop="host", ran=loops)
    dev = run(packed_bf16, plan, "on-demand", graphs=graphs, loop="device", ran=loops)
    assert loops == ["host", "device"]
    assert torch.equal(dev[0], host[0]) and dev[1] == host[1]
    h, d = host[2], dev[2]
    assert d["by_kind"]["in_place"] == h["by_kind"]["demand"] > 0 and d["by_kind"]["demand"] == 0
    assert d["by_kind"]["static"] == h["by_kind"]["static"] and d["uses"] == h["uses"] == 5 * 5 * plan.top_k
    assert d["bytes_from"]["ram"] == h["bytes_from"]["ram"] > 0


@pytest.mark.parametrize("graphs", [True, False])
def test_the_device_lru_gives_the_host_loops_logits_hits_and_bytes(packed_bf16, graphs):
    """LRU-only, VRAM + RAM: the device loop decides the plan's LRU on the device (kernels.lru, its reference on
    the CPU) and copies admitted experts into its slots; the host loop's `Residency` decides the same policy and
    the copy engine moves them. The same experts are hits, the same bytes cross PCIe, the logits are
    bit-identical (prompt and 12 tokens, so the cache fills and evicts).""" 
    plan = bf16_plan(4, 28, 2, 0, chunk=1)        # prefill a token a call: every call goes through the cache
    loops: list[str] = []
    host = run(packed_bf16, plan, "lru", new=12, graphs=graphs, loop="host", ran=loops)
    dev = run(packed_bf16, plan, "lru", new=12, graphs=graphs, loop="device", ran=loops)
    assert loops == ["host", "device"]
    assert torch.equal(dev[0], host[0]) and dev[1] == host[1]
    h, d = host[2], dev[2]
    assert d["by_kind"]["cached"] == h["by_kind"]["cached"] > 0 and d["by_kind"]["static"] == h["by_kind"]["static"]
    assert d["by_kind"]["in_place"] == h["by_kind"]["demand"] and d["bytes_from"]["ram"] == h["bytes_from"]["ram"]


def bench_both_loops(packed, plan, mode: str) -> tuple[dict, dict]:
    """`bench.measure` of `plan` in `mode` with the same replayed routing (olmoe-like, seed 3): (host, device)."""
    from strata_plan.engine.bench import measure
    from strata_plan.engine.replay import Replay
    got = []
    for loop in ("host", "device"):
        replay = Replay.from_prior("olmoe-like", len(plan.layers), plan.n_experts, plan.top_k, tokens=64, seed=3)
        got.append(measure(packed, plan, mode=mode, tokens=6, warmup=3, replay=replay, device="cpu",
                           options=EngineOptions(loop=loop)))
    return got[0], got[1]


@pytest.mark.parametrize("mode,cache", [("on-demand", 0), ("lru", 2)])
def test_bench_with_replayed_routing_gives_the_same_tokens_and_counts_in_both_loops(packed_bf16, mode, cache):
    """`bench.measure` with routing replayed: the device loop reads the replay from the device at a cursor it
    advances itself, the host loop from the host; the same rows drive both, so tokens and counts agree."""
    h, d = bench_both_loops(packed_bf16, bf16_plan(4, 28, cache, 0, chunk=1), mode)
    assert (h["loop"], d["loop"]) == ("host", "device") and d["tokens"] == h["tokens"]
    for kind in ("static", "cached"):
        assert d["counters"]["by_kind"][kind] == h["counters"]["by_kind"][kind]
    assert d["bytes_per_token"]["ram"] == h["bytes_per_token"]["ram"] > 0


def test_the_loop_asked_for_runs_every_plan(packed_bf16):
    """`--loop` picks the loop for every plan: caches, lookahead, NVMe tiers."""
    for loop in ("device", "host"):
        loops: list[str] = []
        for split, mode in (((4, 28, 0, 0), "on-demand"), ((4, 28, 2, 0), "lru"), ((4, 10, 2, 1), "plan"),
                            ((4, 28, 2, 1), "plan")):
            run(packed_bf16, bf16_plan(*split), mode, new=1, ran=loops, loop=loop)
        assert loops == [loop] * 4


@pytest.mark.parametrize("split", [(4, 28, 0, 2), (4, 28, 2, 2), (4, 28, 2, 1)])
def test_the_device_loops_lookahead_prefetches_what_the_host_loops_does(packed_bf16, split):
    """Lookahead in the device loop (VRAM + RAM plans): the gate of layer j+d guesses after layer j, the missing RAM
    experts are copied into VRAM staging slots (kernels.prefetch; on the CPU they land at once, as the host loop's
    prefetches do when nothing else holds the link); the same logits bit for bit, the same experts prefetched, cached
    and wasted, the same bytes over PCIe."""
    plan = bf16_plan(*split, chunk=1)
    loops: list[str] = []
    host = run(packed_bf16, plan, "plan", new=12, loop="host", ran=loops)
    dev = run(packed_bf16, plan, "plan", new=12, loop="device", ran=loops)
    assert loops == ["host", "device"] and torch.equal(dev[0], host[0]) and dev[1] == host[1]
    h, d = host[2], dev[2]
    for kind in ("static", "cached", "prefetched"):
        assert d["by_kind"][kind] == h["by_kind"][kind], kind
    assert d["by_kind"]["prefetched"] > 0 and d["by_kind"]["in_place"] == h["by_kind"]["demand"]
    for key in ("bytes_from", "wasted_bytes", "prefetch_bytes"):
        assert d[key] == h[key], key
    depth = str(plan.prefetch_depth)              # precision and recall of the prefetched depth's guesses
    assert d["lookahead"][depth] == h["lookahead"][depth] and d["lookahead"][depth]["guesses"] > 0


@pytest.mark.gpu
def test_cuda_graphs_replay_the_eager_segments(packed_bf16):
    """On a GPU, the host loop: decode steps replayed from CUDA graphs (captured at the second step) give the eager
    segments' tokens, and their logits to bf16 rounding, with the tiers and the lookahead at work. Each
    step's logits are kept: a runner that returned the graph's output buffer itself (overwritten by the
    next replay) fails here."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    for split, mode in CASES:
        plan = bf16_plan(*split)
        eager, eager_tokens, _ = run(packed_bf16, plan, mode, new=6, device="cuda", graphs="eager", loop="host")
        graphed, tokens, _ = run(packed_bf16, plan, mode, new=6, device="cuda", loop="host")   # GraphedDecode
        assert tokens == eager_tokens, mode
        torch.testing.assert_close(graphed, eager, rtol=0, atol=2 ** -7 * float(eager.abs().max()))


@pytest.mark.gpu
def test_the_device_loop_on_a_gpu_reads_registered_ram_in_place(packed_bf16):
    """On a GPU: the device loop (one CUDA graph a token, RAM experts read over PCIe from the registered RAM tier)
    gives the host loop's tokens (copies into VRAM slots, graphed segments), its logits to bf16 rounding, and the
    same routed bytes from RAM."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    for mode, cache in (("on-demand", 0), ("lru", 2)):     # lru: the device LRU (kernels.lru) and its fill
        plan = bf16_plan(4, 28, cache, 0, chunk=1)
        loops: list[str] = []
        host, host_tokens, hc = run(packed_bf16, plan, mode, new=12, device="cuda", loop="host", ran=loops)
        dev, tokens, dc = run(packed_bf16, plan, mode, new=12, device="cuda", loop="device", ran=loops)
        assert loops == ["host", "device"] and tokens == host_tokens, mode
        torch.testing.assert_close(dev, host, rtol=0, atol=2 ** -7 * float(host.abs().max()))
        assert dc["bytes_from"]["ram"] == hc["bytes_from"]["ram"] > 0
        assert dc["by_kind"]["cached"] == hc["by_kind"]["cached"] and (dc["by_kind"]["cached"] > 0) == (cache > 0)
    texts = []
    for loop in ("host", "device"):          # generate: the device loop queues each step before reading a token
        with Engine.open(packed_bf16, plan, EngineOptions(mode="on-demand", device="cuda", loop=loop)) as eng:
            assert getattr(eng.model.step_runner, "ahead", False) == (loop == "device")
            texts.append(eng.generate(PROMPT, max_new_tokens=8))
    assert texts[0] == texts[1] == host_tokens[:len(texts[0])]


@pytest.mark.gpu
def test_on_a_gpu_the_device_loops_lookahead_gives_the_host_loops_tokens(packed_bf16):
    """On a GPU: the guesses copied on a side stream forked and joined inside the token's graph, resolved with the
    slot protocol (a late guess read in place): the host loop's tokens, logits to bf16 rounding, some guesses used."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    for split in ((4, 28, 0, 2), (4, 28, 2, 1)):
        plan = bf16_plan(*split, chunk=1)
        host, host_tokens, _ = run(packed_bf16, plan, "plan", new=12, device="cuda", loop="host")
        dev, tokens, dc = run(packed_bf16, plan, "plan", new=12, device="cuda", loop="device")
        assert tokens == host_tokens, split
        torch.testing.assert_close(dev, host, rtol=0, atol=2 ** -7 * float(host.abs().max()))
        assert dc["by_kind"]["prefetched"] + dc["by_kind"]["late"] > 0


def test_sampled_generation_in_the_device_loop_repeats_with_its_seed(packed_bf16):
    """Sampling in the device loop is drawn inside the step (`GumbelPick`): the same seed gives the same text, another
    seed (almost surely) another; greedy is the host loop's."""
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
    bt = r["bytes_per_token"]       # copied: what the copies moved; pcie: every fetch issued (cancelled ones too)
    assert 0 < bt["pcie_copied"] <= bt["pcie"] + bt["dense"] + 1e-9


@pytest.mark.parametrize("extra,field", [(["--max-tokens", "0"], "--max-tokens"),
                                        (["--prompt", "x" * 400], "exceed the context"),
                                        (["--max-tokens", "100000"], "context of 64 tokens (the plan's context; "
                                                                     "the model has 1024 positions)"),
                                        (["--mode", "fast"], "--mode")])
def test_run_mistakes_exit_2_in_one_line(packed_bf16, plan_file, capsys, extra, field):
    from strata_plan.cli import main
    args = ["run", "--packed", str(packed_bf16), "--plan", str(plan_file), "--prompt", "hi", "--device", "cpu"]
    with pytest.raises(SystemExit) if extra[0] == "--mode" else contextlib.nullcontext():
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


def demand_copies(layers, head, passes: int) -> int:
    """Layer copies issued only when their layer started: layer 0's in the first pass (nothing ran before
    it); with an odd number of units (3 or more) in every pass, as unit 0 (u lands in buffer u mod 2)
    shares its buffer with the last unit of the pass before and is issued once that has run."""
    if 0 not in layers:
        return 0
    units = len(layers) + (head == "ram")
    return passes if units >= 3 and units % 2 else 1


@pytest.mark.parametrize("layers,head", STREAMS)
def test_streamed_dense_weights_give_the_resident_logits_bit_for_bit(packed_bf16, layers, head):
    """Streaming changes where dense weights are read from, never what is computed: one token a call and
    in chunks (same tiers, so the same waves), with and without lookahead (routers kept resident). The host loop
    copies them through the store's queue and runs the model's own forward (graphs off), so the resident reference
    does too; the device loop reads them in place (no copies) in its step, as the resident plan's step."""
    for split, mode, chunk in [((4, 10, 3, 2), "plan", 1), ((2, 6, 0, 0), "on-demand", 5), ((4, 10, 3, 2), "lru", 5)]:
        plan = bf16_plan(*split, chunk=chunk)
        for loop in ("host", "device"):
            ref_logits, ref_tokens, _ = run(packed_bf16, plan, mode, new=4, graphs=loop == "device", loop=loop)
            ran: list[str] = []
            logits, tokens, counters = run(packed_bf16, streaming(plan, layers, head), mode, new=4, loop=loop, ran=ran)
            assert ran == [loop] and torch.equal(logits, ref_logits), (layers, head, mode, chunk, loop)
            assert tokens == ref_tokens
            assert counters["dense_bytes"]["layers"] > 0 if layers else counters["dense_bytes"]["layers"] == 0
            copies = demand_copies(layers, head, passes=-(-len(PROMPT) // chunk) + 4) if loop == "host" else 0
            assert counters["dense_demand"] == copies


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


@pytest.mark.gpu
def test_on_the_gpu_streamed_dense_weights_give_the_resident_logits(packed_bf16):
    """The CPU comparison above on CUDA (bf16, Triton fused MoE): the host loop's copies on the store's copy stream,
    the compute stream waiting on their events, buffers reused only after their last kernel; bit for bit where two
    resident runs are (the kernels are deterministic), else within their run-to-run spread. The device loop's
    in-place reads (device tensors over pinned RAM) against the resident device loop, to bf16 rounding."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    for split, mode, chunk in [((4, 10, 3, 2), "plan", 1), ((4, 10, 3, 2), "lru", 5)]:
        plan = bf16_plan(*split, chunk=chunk)
        ref_logits, ref_tokens, _ = run(packed_bf16, plan, mode, new=8, device="cuda", graphs=False, loop="host")
        again, _, _ = run(packed_bf16, plan, mode, new=8, device="cuda", graphs=False, loop="host")
        spread = float((again - ref_logits).abs().max())
        dev_logits, dev_tokens, _ = run(packed_bf16, plan, mode, new=8, device="cuda")      # the device loop
        for layers, head in STREAMS:
            logits, tokens, c = run(packed_bf16, streaming(plan, layers, head), mode, new=8, device="cuda", loop="host")
            diff = float((logits - ref_logits).abs().max())
            assert diff <= spread, (layers, head, mode, chunk, diff, spread)
            assert tokens == ref_tokens
            assert c["dense_bytes"]["lm_head"] > 0 if head == "ram" else c["dense_bytes"]["lm_head"] == 0
            assert c["dense_demand"] == demand_copies(layers, head, passes=-(-len(PROMPT) // chunk) + 8)
            # the device loop: the streamed tensors read in place over PCIe inside the token's graph
            logits, tokens, c = run(packed_bf16, streaming(plan, layers, head), mode, new=8, device="cuda")
            torch.testing.assert_close(logits, dev_logits, rtol=0, atol=2 ** -7 * float(dev_logits.abs().max()))
            assert tokens == dev_tokens and c["dense_demand"] == 0


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
    for loop in ("host", "device"):
        ref_logits, ref_tokens, _ = run(packed_tied, plan, "lru", new=3, graphs=loop == "device", loop=loop)
        logits, tokens, c = run(packed_tied, streaming(plan, layers, head), "lru", new=3, loop=loop)
        assert torch.equal(logits, ref_logits) and tokens == ref_tokens, loop
        assert (c["dense_bytes"]["embeddings"] > 0) == (head == "ram")
        assert (c["dense_bytes"]["lm_head"] > 0) == (head == "ram")
