"""`strata-plan run --packed DIR --plan PLAN --prompt TEXT`: generate text with a plan executed by the
engine (tiered expert store, router-lookahead prefetch, the model's own forward), streamed as it comes.
Works without a GPU too (the CPU stands in for VRAM, slowly)."""
from __future__ import annotations

import sys

from strata_plan.cli._common import add_json, print_json
from strata_plan.core.modes import MODES
from strata_plan.errors import UserError


def add_engine_args(p) -> None:
    """The arguments `run` and `bench` share: the packed folder, the plan, the mode, the device."""
    p.add_argument("--packed", required=True, help="packed model folder (strata-plan pack)")
    p.add_argument("--plan", required=True, help="plan YAML (strata-plan plan) for that packed model")
    p.add_argument("--mode", default="plan", choices=MODES,
                   help="plan (default): as planned; lru: no lookahead prefetch; on-demand: no cache, no prefetch")
    p.add_argument("--device", default="", help="cuda or cpu (default: cuda when there is a GPU)")
    p.add_argument("--tokens-per-graph", type=int, default=4, metavar="K",
                   help="decode tokens one CUDA graph launch runs (default 4; 1 to 64): the host's launch and wait are "
                        "shared by K tokens, which reach the host K at a time")
    p.add_argument("--stager-io", default=None, choices=("aio", "threads"),
                   help="how the NVMe stager reads (a plan with an NVMe tier): a layer's reads submitted together "
                        "through Linux native AIO (default where the kernel has it), or a reader thread a read")


def register(sub) -> None:
    p = sub.add_parser("run", help="generate text with a plan executed by the engine",
                       description=__doc__.split("\n\n")[0])
    add_engine_args(p)
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument("--max-tokens", type=int, default=64, help="new tokens at most (default 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1: off)")
    p.add_argument("--seed", type=int, help="sampling seed")
    add_json(p, "print the generated ids, text and store counters as JSON at the end")
    p.set_defaults(func=cmd_run)


def cmd_run(args) -> int:
    import time

    from strata_plan.core.plan import load_plan
    from strata_plan.engine.engine import Engine, EngineOptions, check_one_gpu, prompt_ids, resolve_device
    from strata_plan.engine.generate import Sampling, TextStream
    if args.max_tokens < 1:
        raise UserError("--max-tokens", str(args.max_tokens), "must be at least 1", "ask for one token or more")
    sampling = Sampling(args.temperature, args.top_p, args.seed)
    opts = EngineOptions(mode=args.mode, device=args.device, tokens_per_graph=args.tokens_per_graph,
                         **({"stager_io": args.stager_io} if args.stager_io else {}))
    resolve_device(args.device)                         # before any work: a device this torch lacks is one line
    plan = load_plan(args.plan)
    check_one_gpu(plan, args.plan)
    prompt = prompt_ids(args.packed, plan.context, args.prompt, args.max_tokens)      # fits, or one line
    with Engine.open(args.packed, plan, opts, plan_path=args.plan) as eng:
        tok = eng.tokenizer()
        stream = TextStream(tok)
        if not args.json:
            sys.stdout.write(args.prompt)
            sys.stdout.flush()

        def on_token(t: int) -> None:
            piece = stream.push(t)
            if piece and not args.json:
                sys.stdout.write(piece)
                sys.stdout.flush()

        t0 = time.perf_counter()
        ids = eng.generate(prompt, args.max_tokens, sampling, on_token=on_token)
        dt = time.perf_counter() - t0
        tail = stream.flush() if hasattr(stream, "flush") else ""
        counters = eng.store.counter_data()          # the device loop's counts folded in
        if args.json:
            print_json({"prompt_tokens": len(prompt), "ids": ids, "text": tok.decode(ids), "seconds": dt,
                        "device": str(eng.model.device), "counters": {k: v for k, v in counters.items() if k != "layers"}})
        else:
            sys.stdout.write(tail + "\n")
            print(f"[{len(ids)} tokens in {dt:.2f} s on {eng.model.device} (prefill included, measured); "
                  f"hit rate {counters['hit_rate']:.3f}]", file=sys.stderr)
    return 0
