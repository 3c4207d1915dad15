"""The engine's model runtime beyond the comparison with transformers (tests/test_engine_models.py):
MLA's absorbed form against the expanded one, KV bytes as the planner counts them, router lookahead
against the committed routing trace, packed experts through `fused_moe` against BF16 experts, sampling and bad
input."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from strata_plan.engine.config import ModelConfig  # noqa: E402
from strata_plan.engine.experts import PackedExperts, TorchExperts  # noqa: E402
from strata_plan.engine.generate import (Sampling, TextStream, encode_prompt, generate, generate_text,  # noqa: E402
                                         load_tokenizer, sample)  # noqa: E402
from strata_plan.engine.kv import MLACache, make_cache  # noqa: E402
from strata_plan.engine.model import MoEModel  # noqa: E402
from strata_plan.engine.weights import TensorSource  # noqa: E402
from strata_plan.errors import UserError  # noqa: E402
from strata_plan.core.routing import load_trace  # noqa: E402
from strata_plan.core.spec import MODELS_DIR, load_spec  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "fixture-moe"
TRACE = ROOT / "tests" / "data" / "fixture-moe.trace.npz"
HELDOUT = np.load(FIXTURE / "heldout_tokens.npz")


@pytest.fixture(scope="module")
def cfg():
    return ModelConfig.load(FIXTURE)


@pytest.fixture(scope="module")
def experts32(cfg):
    return TorchExperts.from_checkpoint(FIXTURE, cfg, dtype=torch.float32)


@pytest.fixture(scope="module")
def engine(cfg, experts32):
    return MoEModel(cfg, TensorSource(FIXTURE), experts32, context=128, dtype=torch.float32)


def _prompt(n=40, seq=0):
    return HELDOUT["tokens"][HELDOUT["sequence"] == seq][:n].tolist()


# ---- attention and cache ------------------------------------------------------------------------

def test_mla_absorbed_form_equals_the_expanded_one(engine):
    """A 7-token chunk after 20 cached tokens, both forms on the same cache: same output (float32)."""
    engine.reset()
    engine.prefill(_prompt(20), chunk=20)
    torch.manual_seed(0)
    x = torch.randn(7, engine.cfg.hidden)
    attn = engine.layers[2].attn
    expanded = attn(x, 20, engine.cache, engine.rope, absorbed=False)
    absorbed = attn(x, 20, engine.cache, engine.rope, absorbed=True)
    torch.testing.assert_close(absorbed, expanded, atol=1e-5, rtol=1e-5)
    assert float(expanded.abs().max()) > 0.1


@pytest.mark.parametrize("model", [str(FIXTURE), "kimi-k3.1-pro", "deepseek-v3", "qwen3-30b-a3b", "mixtral-8x7b"])
def test_kv_cache_holds_what_the_planner_counts(model):
    """The cache of a whole context in bf16 is `ModelSpec.kv_cache_bytes(context)`: MLA's latent + rope key."""
    path = FIXTURE / "config.json" if model == str(FIXTURE) else MODELS_DIR / f"{model}.json"
    cfg = ModelConfig.load(path)
    spec = load_spec(str(path))
    cache = make_cache(cfg, 4096, "meta", torch.bfloat16)
    tensors = [cache.rows] if isinstance(cache, MLACache) else [cache.k, cache.v]
    assert sum(t.numel() * t.element_size() for t in tensors) == spec.kv_cache_bytes(4096)
    if cfg.is_mla:
        a = spec.attention
        assert cache.rows.shape == (spec.n_layers, 4096, a.kv_lora_rank + a.qk_rope_head_dim)


# ---- router lookahead ----------------------------------------------------------------------------

def test_routing_and_lookahead_reproduce_the_committed_trace(engine):
    """The trace (benchmarks/moe/trace.py, float32 on an H200) records per token the top-k of every MoE
    layer and the lookahead guesses `route(i + d, output of MoE layer i)`: the engine's router and its
    `after_moe` + `route` hook give the same ids, in the same order, for the first 48 tokens of 4 files."""
    trace = load_trace(TRACE, load_spec(str(FIXTURE)))
    n_moe, depth = engine.cfg.n_moe_layers, trace.depth
    for s in range(4):
        rows = np.flatnonzero(trace.sequence == s)[:48]
        tokens = HELDOUT["tokens"][rows].tolist()
        hidden, routed = {}, {}
        engine.reset()
        engine.after_moe = lambda i, h: hidden.setdefault(i, []).append(h.clone())
        original = engine.experts
        engine.experts = lambda i, x, ids, w: routed.setdefault(i, []).append((ids, w)) or original(i, x, ids, w)
        try:
            engine.prefill(tokens, chunk=16)                 # chunks of 16: the cache carries the rest
        finally:
            engine.after_moe, engine.experts = None, original
        for i in range(n_moe):
            ids = torch.cat([r[0] for r in routed[i]]).numpy()
            w = torch.cat([r[1] for r in routed[i]]).numpy()
            assert np.array_equal(ids, trace.experts[rows, i])
            np.testing.assert_allclose(w, trace.weights[rows, i], atol=1e-4)
            h = torch.cat(hidden[i])
            for d in range(1, depth + 1):
                want = trace.lookahead_experts[rows, i, d - 1]
                if i + d >= n_moe:
                    assert (want == -1).all()
                    continue
                la_ids, la_w = engine.route(i + d, h)
                assert np.array_equal(la_ids.numpy(), want)
                np.testing.assert_allclose(la_w.numpy(), trace.lookahead_scores[rows, i, d - 1], atol=1e-4)


# ---- packed experts ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def packed_bf16(tmp_path_factory, one_torch_thread):
    from strata_plan.cli import main as cli_main
    out = tmp_path_factory.mktemp("packed") / "bf16"
    assert cli_main(["pack", str(FIXTURE), "--out", str(out), "--format", "bf16", "--json"]) == 0
    return out


def test_packed_bf16_experts_through_fused_moe_match_torch_experts(packed_bf16, engine, cfg):
    """The packed folder (dense.safetensors + bf16 blobs through fused_moe's torch path) gives the logits
    of the checkpoint with TorchExperts: the same bf16 values, float32 math in both."""
    packed = MoEModel.load(packed_bf16, PackedExperts(packed_bf16, cfg, backend="torch"), context=128,
                           dtype=torch.float32)
    prompt = _prompt(20, seq=1)
    engine.reset()
    ref = engine.prefill(prompt, chunk=8, all_logits=True)
    got = packed.prefill(prompt, chunk=8, all_logits=True)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    nxt = int(ref[-1].argmax())
    torch.testing.assert_close(packed.decode_step(nxt), engine.decode_step(nxt), atol=1e-4, rtol=1e-4)


# ---- sampling ------------------------------------------------------------------------------------

def test_sampling_follows_temperature_and_top_p():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    gen = torch.Generator().manual_seed(0)
    n = 4000
    draws = torch.cat([sample(logits, Sampling(temperature=1.0), gen) for _ in range(n)])
    freq = torch.bincount(draws, minlength=4).float() / n
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.03)         # ~4 sigma at n=4000
    nucleus = torch.cat([sample(logits, Sampling(temperature=1.0, top_p=0.7), gen) for _ in range(500)])
    assert set(nucleus.tolist()) == {0, 1}                                                # 0.5 + 0.3 reaches 0.7
    hot = torch.cat([sample(logits, Sampling(temperature=4.0), gen) for _ in range(n)])
    assert torch.bincount(hot, minlength=4)[3] / n > 0.15                                 # flatter at T = 4
    assert int(sample(logits, Sampling())) == 0


def test_the_graph_safe_sampler_draws_as_the_reference_does():
    """`GumbelPick` (what the device loop draws inside the step's graph: Gumbel-max over a counter hash) against the
    same frequencies `sample` is held to: temperature and nucleus as above, each draw a new counter, a seed repeats."""
    from strata_plan.engine.picks import GumbelPick
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    n = 4000
    pick = GumbelPick(1.0, 1.0, seed=3)
    draws = torch.cat([pick(logits) for _ in range(n)])
    freq = torch.bincount(draws, minlength=4).float() / n
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.03)         # ~4 sigma at n=4000
    nucleus = GumbelPick(1.0, 0.7, seed=3)
    assert set(torch.cat([nucleus(logits) for _ in range(500)]).tolist()) == {0, 1}
    hot = GumbelPick(4.0, 1.0, seed=3)
    assert torch.bincount(torch.cat([hot(logits) for _ in range(n)]), minlength=4)[3] / n > 0.15
    again = GumbelPick(1.0, 1.0, seed=3)
    assert torch.equal(torch.cat([again(logits) for _ in range(50)]), draws[:50])


def test_seeded_sampled_generation_repeats_and_greedy_is_the_argmax_chain(engine):
    prompt = _prompt(12, seq=3)
    s = Sampling(temperature=0.8, top_p=0.95, seed=7)
    a, b = generate(engine, prompt, 10, chunk=8, sampling=s, eos_ids=()), generate(engine, prompt, 10, chunk=8, sampling=s, eos_ids=())
    assert a == b and len(a) == 10
    greedy = generate(engine, prompt, 5, chunk=8, eos_ids=())
    engine.reset()
    chain, logits = [], engine.prefill(prompt, chunk=8)
    for _ in range(5):
        chain.append(int(logits.argmax()))
        logits = engine.decode_step(chain[-1])
    assert greedy == chain


def test_generation_stops_at_eos(engine):
    prompt = _prompt(12, seq=3)
    first = generate(engine, prompt, 1, chunk=8, eos_ids=())[0]
    assert generate(engine, prompt, 10, chunk=8, eos_ids=(first,)) == [first]


def test_tokenizer_and_prompt_encoding(cfg, engine):
    tok = load_tokenizer(FIXTURE)
    prompt = "def main():\n    return 0\n"
    ids = encode_prompt(tok, prompt, cfg, FIXTURE)
    assert ids == tok.encode(prompt).ids                               # the fixture's tokenizer adds no BOS
    new = generate(engine, ids, 8, chunk=4)
    pieces = []
    assert generate_text(engine, tok, prompt, 8, chunk=4, folder=FIXTURE, on_text=pieces.append) == tok.decode(new)
    assert "".join(pieces) == tok.decode(new)
    text = "x = 'naïve ☃ 数据'\n"                   # multi-byte characters split over byte-level tokens
    stream = TextStream(tok)
    pieces = [stream.push(t) for t in tok.encode(text).ids]
    assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces) and "" in pieces


# ---- bad input -----------------------------------------------------------------------------------

def test_bad_input_is_one_line(engine, tmp_path):
    with pytest.raises(UserError, match="--max-tokens"):
        generate(engine, [1, 2], 0, chunk=4)
    with pytest.raises(UserError, match="exceed the context of 128"):
        generate(engine, list(range(120)), 10, chunk=64)
    assert TensorSource(FIXTURE / "model.safetensors").names == TensorSource(FIXTURE).names
    with pytest.raises(UserError, match="tensor missing"):
        TensorSource(FIXTURE).get("model.layers.99.mlp.gate.weight")
    with pytest.raises(UserError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
    cfg = json.loads((MODELS_DIR / "gpt-oss-20b.json").read_text())
    with pytest.raises(UserError, match="model_type") as e:
        ModelConfig.from_dict(cfg, "gpt-oss/config.json")
    assert "\n" not in str(e.value) and "fix:" in str(e.value)
    bad = json.loads((FIXTURE / "config.json").read_text())
    bad["rope_parameters"] = {"rope_type": "longrope", "rope_theta": 1e4}
    with pytest.raises(UserError, match="rope"):
        ModelConfig.from_dict(bad, "x/config.json")
    with pytest.raises(ValueError, match="exceed the context"):
        engine.reset()
        engine.prefill(list(range(129)), chunk=64)
    engine.reset()


# ---- device --------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_cuda_bf16_forward_makes_no_host_sync_and_matches_cpu(cfg, engine, packed_bf16):
    """On a GPU: the fixture in bf16 through the packed Triton MoE (`fused_moe`, backend auto) stays near
    the float32 CPU reference; with the experts replaced by a gather that needs no ids on the host, decode
    steps (sliced and static) run under CUDA's sync debug mode set to error, and a static step captured
    in a CUDA graph replays the eager steps' logits."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    dev = "cuda"
    prompt = _prompt(40, seq=2)
    engine.reset()
    ref = engine.prefill(prompt, chunk=16, all_logits=True)
    gpu = MoEModel.load(packed_bf16, PackedExperts(packed_bf16, cfg, device=dev, backend="auto"), context=64,
                        device=dev, dtype=torch.bfloat16)
    got = gpu.prefill(prompt, chunk=16, all_logits=True).cpu()
    # the same kernels in Triton's interpreter on the CPU, bf16: mean |error| 0.034, top-1 97.5% (torch bf16
    # experts: 0.031, 97.5%); the maximum (~1) comes from a near-tied expert choice flipping
    assert float((got - ref).abs().mean()) < 0.1
    assert float((got.argmax(-1) == ref.argmax(-1)).float().mean()) >= 0.9
    torch_exp = TorchExperts.from_checkpoint(FIXTURE, cfg, device=dev, dtype=torch.bfloat16)

    def gathered(i, x, ids, w):                          # no host sync: every expert's weights gathered per slot
        g, u, d = (m[ids] for m in torch_exp.layers[i])                        # [M, k, ...]
        h = torch.nn.functional.silu(torch.einsum("mh,mkih->mki", x, g)) * torch.einsum("mh,mkih->mki", x, u)
        return (torch.einsum("mki,mkhi->mkh", h, d) * w[..., None]).sum(1).to(x.dtype)

    gpu.experts = gathered
    gpu.reset()
    gpu.prefill(prompt, chunk=16)
    token = torch.tensor([int(prompt[0])], device=dev)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for static in (False, True):
            for _ in range(3):
                token = gpu.decode_step(token, static=static).argmax().reshape(1)
    finally:
        torch.cuda.set_sync_debug_mode("default")

    # the whole static step captured once in a CUDA graph, replayed at three positions: the eager steps' logits
    steps = [11, 22, 33]
    gpu.reset()
    gpu.prefill(prompt, chunk=16)
    eager = [gpu.decode_step(t) for t in steps]
    gpu.reset()
    gpu.prefill(prompt, chunk=16)
    buf = torch.zeros(1, dtype=torch.long, device=dev)
    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            gpu.at.fill_(gpu.pos)
            gpu.step_at(buf)                                 # warm-up (writes position pos, rewritten below)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = gpu.step_at(buf)
        replayed = []
        for t in steps:
            buf.fill_(t)
            gpu.at.fill_(gpu.pos)
            graph.replay()
            gpu.pos += 1
            replayed.append(out.clone())
    for a, b in zip(replayed, eager):
        assert float((a - b).abs().max()) < 0.05
