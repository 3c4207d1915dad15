"""Diagnostic (GPU, 10-30 s a model): are the profiler's layer times, taken on a cut of the model
(`engine.layer_times`: its layers up to the second MoE layer), what every layer of the whole model takes in one graph?

    python3 benchmarks/tools/cut_probe.py CONFIG.json|SPEC     # writes $OUT/cut_probe-<model>.json (not a benchmark)

Times the prefix graphs of the cut and of the whole model (random weights, context 1024) through
`layer_times._prefix_times`, replayed back to back (L2 warm) and after a write of twice the L2 (cold, what the
profiler does), and prints per layer and the whole model's step from the cut's per-layer means beside the whole
graph's. On the H100 machine (2026-12-05, one call, microseconds):

    model                       L2     step from the cut   whole graph
    bench-moe (hidden 512)      warm   726.0               835.3        the cut's weights stay in L2
                                cold   836.5               852.8
    qwen3-30b-a3b               warm   4373.3              4282.9
                                cold   4272.7              4290.0

The engine's step without its MoE calls measured 858 us on the trained bench-moe (engine-trained-20261205T173331Z)."""
import json, os, statistics, sys
import torch
import strata_plan.engine.layer_times as lt
from strata_plan.core.spec import load_spec, spec_from_config, truncate_config
from strata_plan.engine.config import ModelConfig
cfgp = sys.argv[1]
spec = load_spec(cfgp)
out = {"gpu": torch.cuda.get_device_name(), "model": cfgp, "n_layers": spec.n_layers, "n_moe": spec.n_moe_layers}
for cold in (False, True):
    runs = {}
    for name, n in (("cut", min(2, spec.n_moe_layers)), ("full", spec.n_moe_layers)):
        d = truncate_config(lt.config_of(spec), n, spec.source or spec.name)
        cut = spec_from_config(d, spec.name, spec.source or spec.name)
        times = lt._prefix_times(ModelConfig.from_dict(d, cfgp), cut, 1024, 30, "cuda", cold=cold)
        med = [statistics.median(t) for t in times]
        layer = [statistics.median(b - a for a, b in zip(times[i], times[i + 1])) for i in range(cut.n_layers)]
        runs[name] = {"head_us": med[0], "total_us": med[-1], "layer_us": [round(x, 2) for x in layer],
                      "kinds": list(cut.layer_kinds)}
        torch.cuda.empty_cache()
    c, f = runs["cut"], runs["full"]
    mean = {k: statistics.mean([t for t, kk in zip(c["layer_us"], c["kinds"]) if kk == k] or [0.0])
            for k in ("moe", "dense")}
    runs["from_cut_us"] = c["head_us"] + sum(mean[k] for k in f["kinds"])
    key = "cold" if cold else "warm"
    out[key] = runs
    print(f"{cfgp} L2 {key}: cut layers {[round(x) for x in c['layer_us']]}, whole model's "
          f"{[round(x) for x in f['layer_us']]}; step from the cut {runs['from_cut_us']:.1f} us, "
          f"the whole graph {f['total_us']:.1f} us", flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), f"cut_probe-{spec.name}.json"), "w"), indent=1)
