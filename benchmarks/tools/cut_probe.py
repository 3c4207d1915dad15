"""Diagnostic (GPU, 20 s): are the profiler's layer times, taken on a cut of the model (`engine.layer_times`: its
layers up to the second MoE layer), what every layer of the whole model takes in one graph?

    python3 benchmarks/tools/cut_probe.py CONFIG.json        # writes $OUT/cut_probe.json (not a benchmark)

Times the prefix graphs of the cut and of the whole model (random weights, context 1024) through
`layer_times._prefix_times`, and the whole model's step from the cut's per-layer means beside the whole graph's.
On the H100 machine (2026-12-05), bench-moe's geometry (10 layers, hidden 512): with back-to-back replays the cut's
layers stayed in L2 (64-73 us a layer; a step of 734 us from them) while the whole model's rose with depth to
80-87 us (834 us); with the L2 written over before each replay, as `_prefix_times` now does, every layer takes
74-84 us in both, and the cut gives 848.5 us against the whole graph's 842.6 (the engine's step without its MoE
calls measured 858 us on that model)."""
import json, os, statistics, sys
import torch
import strata_plan.engine.layer_times as lt
from strata_plan.core.spec import load_spec, spec_from_config, truncate_config
from strata_plan.engine.config import ModelConfig
cfgp = sys.argv[1]
spec = load_spec(cfgp)
out = {"gpu": torch.cuda.get_device_name(), "n_layers": spec.n_layers, "n_moe": spec.n_moe_layers}
for name, n in (("cut2", min(2, spec.n_moe_layers)), ("full", spec.n_moe_layers), ("cut2_again", 2), ("full_again", spec.n_moe_layers)):
    d = truncate_config(lt.config_of(spec), n, spec.source or spec.name)
    cut = spec_from_config(d, spec.name, spec.source or spec.name)
    cfg = ModelConfig.from_dict(d, cfgp)
    times = lt._prefix_times(cfg, cut, 1024, 30, "cuda")
    med = [statistics.median(t) for t in times]
    layer = [statistics.median(b - a for a, b in zip(times[i], times[i + 1])) for i in range(cut.n_layers)]
    out[name] = {"head_us": med[0], "total_us": med[-1], "layer_us": [round(x, 2) for x in layer],
                 "kinds": list(cut.layer_kinds)}
    print(name, "head", round(med[0], 1), "total", round(med[-1], 1), "layers", [round(x, 1) for x in layer], flush=True)
    torch.cuda.empty_cache()
c, f = out["cut2"], out["full"]
moe = [t for t, k in zip(c["layer_us"], c["kinds"]) if k == "moe"]
dense = [t for t, k in zip(c["layer_us"], c["kinds"]) if k == "dense"]
kinds = f["kinds"]
extrap = c["head_us"] + sum(statistics.mean(moe) if k == "moe" else statistics.mean(dense) for k in kinds)
print(f"full model step from the cut's layer times: {extrap:.1f} us; the full model's graph: {f['total_us']:.1f} us")
out["extrapolated_us"] = extrap
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "cut_probe.json"), "w"), indent=1)
