"""`strata-plan bench --packed DIR --plan PLAN`: measured prefill and decode tok/s of a plan executed by the
engine, beside the planner's prediction for the same plan, with bytes per tier per token, hit rates,
lookahead precision and recall, the time split and the links' achieved bandwidth. `--replay TRACE|PRIOR`
replays routing (a model without trained weights): its hit rates are inputs, not measurements."""
from __future__ import annotations

from strata_plan.cli._common import add_json, console, print_json, table
from strata_plan.cli.run import add_engine_args
from strata_plan.errors import UserError


NO_RATIO_ON_CPU = ("the experts were computed on the CPU, and the cost model predicts a GPU computing them (it "
                   "has no mode for a CPU that computes the experts): the ratio would compare two machines")


def register(sub) -> None:
    p = sub.add_parser("bench", help="measure a plan's tok/s with the engine, beside its prediction",
                       description=__doc__.split("\n\n")[0])
    add_engine_args(p)
    p.add_argument("--tokens", type=int, default=64, help="timed decode tokens (default 64)")
    p.add_argument("--warmup", type=int, default=32, help="decode tokens before timing (default 32)")
    p.add_argument("--replay", help="routing replayed from a trace (.npz) or sampled from a named prior")
    p.add_argument("--replay-seed", type=int, default=11, help="seed of a prior's replayed sample (default 11; "
                   "keep it apart from the seed the plan's statistics were sampled with)")
    p.add_argument("--profile", help="predict with this hardware profile (e.g. one measured on this machine "
                   "with `strata-plan profile`) instead of the plan's own prediction")
    p.add_argument("--temperature", type=float, default=0.0, help="decode tokens drawn at this temperature (0, the "
                   "default: greedy; a small model's greedy text can loop over a few tokens and their experts)")
    p.add_argument("--top-p", type=float, default=1.0, help="with --temperature: nucleus mass (default 1: off)")
    p.add_argument("--seed", type=int, default=0, help="with --temperature: the draws' seed (default 0)")
    p.add_argument("--results", help="folder to write the results JSON to (benchmarks/results format)")
    add_json(p)
    p.set_defaults(func=cmd_bench)


def _replay(args, plan):
    if not args.replay:
        return None
    from strata_plan.engine.replay import Replay
    if args.replay.endswith(".npz"):
        from strata_plan.core.spec import load_spec
        return Replay.from_trace(args.replay, load_spec(plan.sources.model.path or plan.model), seed=args.replay_seed)
    return Replay.from_prior(args.replay, len(plan.layers), plan.n_experts, plan.top_k,
                             tokens=max(4096, 4 * (args.tokens + args.warmup)), seed=args.replay_seed)


def predicted(plan, plan_path: str, profile: str | None, mode: str = "plan", gates: bool = True,
              sampled: bool = False) -> dict:
    """The cost model's figures for this plan run as `mode`: the plan's own (as planned, mode "plan", greedy), or
    re-run on the placement the engine runs with `profile` (default: the one the plan was made with); gates False:
    routing replayed (no lookahead gates run); sampled: the tokens drawn (the draw's measured GPU time counted)."""
    p = plan.predicted
    if not profile and mode == "plan" and (gates or not plan.prefetch_depth) and not sampled:
        return {"source": f"the plan ({plan.sources.profile.name})", "decode_tok_s": p.decode_tok_s,
                "prefill_tok_s": p.prefill_tok_s, "bytes_per_token": dict(p.bytes_per_token or {}),
                "vram_hit_rate": p.vram_hit_rate, "decode_binding": p.decode_binding}
    from strata_plan.planner.repredict import predict_plan
    profile = profile or plan.sources.profile.name
    pr = predict_plan(plan, profile, mode, where=plan_path, gates=gates, sampled=sampled)
    return {"source": f"cost model with {profile}, {mode}" + (", sampled" if sampled else ""),
            "decode_tok_s": pr.decode_tok_s, "prefill_tok_s": pr.prefill_tok_s, "bytes_per_token": dict(pr.bytes_per_token),
            "vram_hit_rate": min(pr.hit_rate, 1.0), "decode_binding": pr.decode_binding}


def _against_profile(r: dict, profile: str) -> dict:
    """The stager's NVMe bytes/s over the run against the profile's O_DIRECT figure at the run's mean read size
    (empty without NVMe reads, or when the profile cannot be loaded: a measured profile recorded by name only)."""
    from strata_plan.profiles.schema import load_profile
    try:
        prof = load_profile(profile)
    except UserError:
        return {}
    c = r["counters"]
    n = c["fetches_from"]["nvme"]
    size = c["bytes_from"]["nvme"] / n if n else 0.0
    out = {"profile": profile, "mean_nvme_read_bytes": size}
    lk = r["links"]
    if size and prof.nvme and lk["nvme_gbps_wall"]:
        curve = prof.nvme[0].rand_read
        out["nvme_share_of_profile"] = lk["nvme_gbps_wall"] / curve.at(size, max(curve.queue_depths))
    return out


def cmd_bench(args) -> int:
    from strata_plan.engine.bench import measure
    from strata_plan.engine.engine import EngineOptions
    from strata_plan.core.plan import load_plan
    from strata_plan.outpaths import check_out_folder
    if args.tokens < 1 or args.warmup < 0:
        raise UserError("--tokens/--warmup", f"{args.tokens}/{args.warmup}", "need at least 1 timed token and "
                        "0 or more warm-up tokens", "pass e.g. --tokens 64 --warmup 32")
    if args.results:                    # before the work: a folder this user can write (or create), not a file
        check_out_folder(args.results, "--results", force=True)
    opts = EngineOptions(tokens_per_graph=args.tokens_per_graph,       # a value out of range: one line, before work
                         **({"stager_io": args.stager_io} if args.stager_io else {}))
    from strata_plan.engine.generate import Sampling, device_pick
    pick = device_pick(Sampling(args.temperature, args.top_p, args.seed))     # a bad value: one line, before work
    plan = load_plan(args.plan)
    pred = predicted(plan, args.plan, args.profile, args.mode, gates=not args.replay, sampled=args.temperature > 0)
    replay = _replay(args, plan)
    con = console(stderr=True)
    with con.status("measuring...") as status:
        r = measure(args.packed, args.plan, mode=args.mode, tokens=args.tokens, warmup=args.warmup, replay=replay,
                    device=args.device, progress=lambda what, i, n: status.update(f"{what} {i}/{n}"),
                    options=opts, pick=pick)
    r["predicted"] = pred
    r["links"].update(_against_profile(r, args.profile or plan.sources.profile.name))
    m = r["measured"]
    r["ratio_measured_to_predicted"] = m["decode_tok_s"] / pred["decode_tok_s"] if pred["decode_tok_s"] else None
    r["ratio_null_because"] = None
    if r["device"] == "cpu":          # measured and predicted are kept; their ratio compares two machines
        r["ratio_measured_to_predicted"] = None
        r["ratio_null_because"] = NO_RATIO_ON_CPU
    if args.results:
        from strata_plan.results import write_result
        metrics = {"decode_tok_s_measured": m["decode_tok_s"], "decode_tok_s_predicted": pred["decode_tok_s"],
                   "prefill_tok_s_measured": m["prefill_tok_s"], "prefill_tok_s_predicted": pred["prefill_tok_s"],
                   "hit_rate_measured": r["hit_rate"], "resident_hit_rate_measured": r["resident_hit_rate"],
                   "vram_hit_rate_predicted": pred["vram_hit_rate"]}
        r["results_file"] = str(write_result("bench", metrics, out_dir=args.results, extra={"run": r}))
    if args.json:
        print_json(r)
        return 0
    on_cpu = r["ratio_null_because"] is not None
    t = table("quantity", "measured", "predicted", *(() if on_cpu else ("measured / predicted",)), keep=0,
              title=f"{plan.model}: {args.mode}, on {args.packed} ({r['device']})"
              + (f" (routing replayed: {replay.source})" if replay else ""))

    def row(*cells: str) -> None:
        t.add_row(*cells[:len(t.columns)])           # on the CPU: no ratio column
    ratio = lambda a, b: f"{a / b:.3f}" if b else "-"   # noqa: E731
    row("decode tok/s (median)", f"{m['decode_tok_s']:.3f}", f"{pred['decode_tok_s']:.3f}",
        ratio(m["decode_tok_s"], pred["decode_tok_s"]))
    row("prefill tok/s", f"{m['prefill_tok_s']:.1f}", f"{pred['prefill_tok_s']:.1f}",
        ratio(m["prefill_tok_s"], pred["prefill_tok_s"]))
    for tier in ("ram", "nvme", "pcie", "wasted"):
        key = "nvme_read" if tier == "nvme" and r["stager"] is not None else tier    # the drive's reads
        a, b = r["bytes_per_token"][tier], (pred["bytes_per_token"] or {}).get(key, 0.0)
        row(f"{tier} GB / token" + (" read" if key != tier else ""), f"{a / 1e9:.4f}", f"{b / 1e9:.4f}", ratio(a, b))
    label = " (replayed: an input)" if replay else ""
    row("hit rate (seeds)" + label, f"{r['hit_rate']:.3f}", "-", "-")
    row("resident hit rate" + label, f"{r['resident_hit_rate']:.3f}",
        f"{pred['vram_hit_rate']:.3f}", ratio(r["resident_hit_rate"], pred["vram_hit_rate"]))
    for d, la in r["counters"]["lookahead"].items():
        row(f"lookahead d={d} P / R", f"{la['precision']:.3f} / {la['recall']:.3f}", "-", "-")
    tp = r["time_per_token"]
    row("decode thread CPU ms/tok", f"{tp['host_cpu_s'] * 1e3:.3f}", "-", "-")
    if r["stager"] is not None:               # the NVMe tier
        row("layers waited for NVMe ms/tok", f"{tp['stage_wait_s'] * 1e3:.2f}", "-", "-")
        row("staging cache hits", f"{r['stager']['staging_hit_rate']:.3f}", "-", "-")
    pc = r["page_cache"]
    if pc["files"]:
        row("NVMe files in page cache", f"{pc['before']:.3f} -> {pc['after']:.3f}", "-", "-")
    if tp["step_launch_host_s"] is not None:
        row("step launch host ms/tok" + (" (graphs)" if r["graphs"] else ""),
            f"{tp['step_launch_host_s'] * 1e3:.3f}", "-", "-")
    if tp["device_compute_s"] is not None:
        row("GPU ms/tok (the step)", f"{tp['device_compute_s'] * 1e3:.2f}", "-", "-")
    lk = r["links"]
    row("PCIe GB/s over the run (RAM + staged)", f"{lk['pcie_gbps_wall']:.1f}", "-", "-")
    row("NVMe GB/s over the run", f"{lk['nvme_gbps_wall']:.2f}", "-", "-")
    if "nvme_share_of_profile" in lk:
        row("NVMe over the run / profile", f"{lk['nvme_share_of_profile']:.2f}", "-", "-")
    con = console()
    con.print(t)
    con.print(f"predicted by {pred['source']} (binding: {pred['decode_binding']}); measured here on "
              f"{r['device']}, {args.tokens} tokens after {args.warmup} warm-up", markup=False)
    if on_cpu:
        con.print(f"no measured / predicted ratio: {NO_RATIO_ON_CPU}", markup=False)
    return 0
