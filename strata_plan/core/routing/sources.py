"""Routing statistics from whatever a user names: a trace `.npz`, Mixtral `*_routing.jsonl` files, a prior
(shipped name or YAML) or a statistics YAML; and their per-layer summary. What `strata-plan stats` runs, and
what `plan` and `pack` read (`load_routing`).

    stats, trace = stats_for(["mixtral-like"], spec, tokens=2048, want_trace=True)
    cols, rows = summary_rows(stats)
"""
from __future__ import annotations

from pathlib import Path

from strata_plan.errors import UserError

DEFAULT_PRIOR_TOKENS = 2048
DEFAULT_PRIOR = "uniform"
"""Without --stats or --prior plans assume uniform routing: the conservative choice, and close to what
load-balanced routers (DeepSeek-V3, Kimi) do over long horizons."""


def load_routing(spec, stats: str | None = None, prior: str | None = None, seed: int = 0, tokens: int | None = None):
    """Routing statistics for `spec`: a statistics YAML or a trace `.npz` (checked against the model), or a
    prior (named or a path), uniform by default."""
    from strata_plan.core import routing
    if stats and prior:
        raise UserError("--stats/--prior", f"{stats} / {prior}", "both given", "pass one: measured statistics or a prior")
    if stats:
        if Path(stats).suffix == ".npz":
            trace = routing.load_trace(stats, spec)
            return routing.compute_stats(trace, source=str(stats))
        return routing.load_stats(stats)
    kw = {"tokens": tokens} if tokens else {}
    return routing.stats_from_prior(prior or DEFAULT_PRIOR, spec.n_moe_layers, spec.n_routed, spec.top_k, seed=seed,
                                    model=spec.name, **kw)


def source_kind(sources: list[str]) -> str:
    """'jsonl', 'npz', 'yaml' (prior or statistics file) or 'prior' (a shipped prior's name)."""
    from strata_plan.core.routing import shipped_priors
    suffixes = {Path(s).suffix for s in sources}
    if suffixes == {".jsonl"}:
        return "jsonl"
    if len(sources) > 1:
        raise UserError("stats", " ".join(sources), "several sources given",
                        "pass one trace, prior or statistics file (several only for Mixtral .jsonl files)")
    s = sources[0]
    if Path(s).suffix == ".npz":
        return "npz"
    if Path(s).suffix in (".yaml", ".yml"):
        return "yaml"
    if s in shipped_priors():
        return "prior"
    raise UserError("stats", s, "is neither a trace (.npz, .jsonl) nor a prior",
                    f"pass a trace file, a prior YAML, or one of the shipped priors: {', '.join(shipped_priors())}")


def stats_for(sources: list[str], spec, tokens: int | None = None, seed: int = 0, warmup: int = 0,
              want_trace: bool = False):
    """(RoutingStats, Trace or None) of `sources` for `spec`. A trace is returned when one was read (JSONL,
    npz) or, with `want_trace`, sampled from the prior; a statistics file has none."""
    from strata_plan.core import routing
    from strata_plan.core.routing.convert import trace_from_jsonl
    from strata_plan.core.routing.sample import sample_trace
    from strata_plan.yamlio import read_yaml
    kind = source_kind(sources)
    if kind in ("jsonl", "npz"):
        if tokens is not None:
            raise UserError("--tokens", str(tokens), "applies to priors only", "drop --tokens for a trace")
        trace = trace_from_jsonl(sources, model=spec.name, n_experts=spec.n_routed) if kind == "jsonl" \
            else routing.load_trace(sources[0])
        trace.check_model(spec, "; ".join(sources))
        if not 0 <= warmup < trace.n_tokens:
            raise UserError("--warmup", str(warmup), f"must be 0..{trace.n_tokens - 1} (the trace has "
                            f"{trace.n_tokens} tokens)", "pass a smaller --warmup")
        return routing.compute_stats(trace, warmup=warmup), trace
    if kind == "yaml":
        data = read_yaml(sources[0])
        if isinstance(data, dict) and data.get("schema") == "strata-plan/routing-stats":
            stats = routing.load_stats(sources[0])
            if (stats.n_experts, stats.top_k, stats.n_layers) != (spec.n_routed, spec.top_k, spec.n_moe_layers):
                raise UserError(sources[0], "layers", f"{stats.n_layers} layers x {stats.n_experts} experts, top-"
                                f"{stats.top_k}; {spec.name} has {spec.n_moe_layers} x {spec.n_routed}, top-{spec.top_k}",
                                "pass the --model the statistics were made for")
            if want_trace:
                raise UserError("--save-trace", "", "a statistics file holds no trace", "pass a trace or a prior")
            return stats, None
    prior = routing.load_prior(sources[0])
    tokens = tokens if tokens is not None else DEFAULT_PRIOR_TOKENS
    if tokens < 1:
        raise UserError("--tokens", str(tokens), "must be at least 1", f"pass e.g. --tokens {DEFAULT_PRIOR_TOKENS}")
    stats = routing.stats_from_prior(prior, spec.n_moe_layers, spec.n_routed, spec.top_k, seed=seed,
                                     tokens=tokens, model=spec.name)
    trace = None
    if want_trace:
        trace = sample_trace(prior.zipf_s, prior.locality, spec.n_moe_layers, spec.n_routed, spec.top_k, tokens,
                             seed, model=spec.name, source=stats.source, permute=False)
    return stats, trace


def summary_rows(stats) -> tuple[list[str], list[dict]]:
    """Column names and one row per layer (a prior's identical layers collapse into one row), plus the mean."""
    E = stats.n_experts
    s1, s2, s3 = max(1, E // 8), max(1, E // 4), max(1, E // 2)
    cols = ["layers", "top-1 share", f"static {s1}", f"static {s2}", f"static {s3}", f"static {s1} + LRU {s1}",
            f"LRU {s2}", "prev reuse"]
    rows = []
    groups = [(0, stats.n_layers - 1)] if stats.kind == "prior" else [(i, i) for i in range(stats.n_layers)]
    for a, b in groups:
        rows.append({"layers": f"{a}" if a == b else f"{a}-{b}", "top-1 share": max(stats.layers[a].popularity),
                     f"static {s1}": stats.static_hit(a, s1), f"static {s2}": stats.static_hit(a, s2),
                     f"static {s3}": stats.static_hit(a, s3), f"static {s1} + LRU {s1}": stats.cache_hit(a, s1, s1),
                     f"LRU {s2}": stats.cache_hit(a, 0, s2), "prev reuse": stats.layers[a].prev_reuse})
    if len(rows) > 1:
        rows.append({"layers": "mean", **{c: sum(r[c] for r in rows) / len(rows) for c in cols[1:]}})
    return cols, rows
