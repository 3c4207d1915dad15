"""A plan, executed: the model runtime over the tiered expert store.

    with Engine.open(packed_dir, plan_path) as eng:           # device: cuda if there is one, else cpu
        ids = eng.generate(eng.encode("def main():"), max_new_tokens=32, on_token=print)

`EngineOptions.mode` picks the levers:
- "plan":      the plan as written: static set, LRU cache, router-lookahead prefetch at the plan's depth;
- "lru":       the same store without lookahead (the LRU-only baseline);
- "on-demand": no cache and no prefetch: every non-static expert read where it lies when the router asks.
A decode token runs the device loop (`device_loop.DeviceDecode`, one CUDA graph a token): every non-static expert is
read by the MoE kernel in place from pinned RAM (the device LRU admitting misses into its VRAM slots, the router
lookahead's guesses copied into VRAM slots on a side stream, `engine.prefetch`; NVMe experts staged into pinned RAM
first by the stager, `engine.staging`). `graphs=False` installs no step runner: the model's own forward runs, and with
"on-demand" it is the plain, non-overlapped reference loop (each routed expert read where it lies when asked), which
tests hold the others to. Prefill (several tokens a call) copies a chunk's missing experts into VRAM slots in waves
(`store.waves`).
The dense weights (attention, norms, routers, shared experts, embeddings, lm_head) are read from the
packed folder's `dense.safetensors`: onto the device, or into pinned RAM where the plan's `dense` section
says (streamed through the store's copy queue by `engine.dense`); the routed experts stay where the plan
puts them. Every byte is checked against index.json before a kernel reads it, always: the store checks the
static and RAM experts at start and each NVMe expert on its first read, and `open` checks dense.safetensors
(`packed.verify_dense`, on hashing threads) before the model loads it; a mismatch is one `UserError` line.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from strata_plan.errors import UserError
from strata_plan.core.plan import LOOKAHEAD_POINTS, load_plan
from strata_plan.core.modes import MODES, baseline

from .config import ModelConfig
from .dense import DenseStream, host_units
from .device_loop import DeviceDecode
from .generate import Sampling, check_length, encode_prompt, generate, load_tokenizer
from .model import MoEModel
from .packed import verify_dense
from .store import ExpertStore, StoreOptions, default_stager_io
from .store_experts import StoreExperts

STAGE_DEPTHS = ("all", "deepest")     # EngineOptions.stage_depths
STAGER_IO = ("aio", "threads")        # EngineOptions.stager_io (store.default_stager_io: aio where the kernel has it)


def resolve_device(name: str = "", flag: str = "--device") -> torch.device:
    """The device the engine runs on: `name` ("cuda", "cuda:N" or "cpu"; "" = cuda when there is a GPU, else
    cpu), refused in one line when this build of torch or this machine has no such device: what `run`,
    `bench` and `eval` check before any work."""
    if not name:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        raise UserError(flag, name, "not a device", f"pass {flag} cuda, cuda:N or cpu") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise UserError(flag, name, f"the engine runs on cuda or cpu, not {dev.type}", f"pass {flag} cuda or cpu")
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        raise UserError(flag, name, f"this torch ({torch.__version__}) is a CPU build, not compiled with CUDA",
                        f"pass {flag} cpu, or install a CUDA build of torch")
    if not torch.cuda.is_available():
        raise UserError(flag, name, "no CUDA GPU is visible to torch (torch.cuda.is_available() is False)",
                        f"pass {flag} cpu, or check the driver and CUDA_VISIBLE_DEVICES")
    n = torch.cuda.device_count()
    if dev.index is not None and dev.index >= n:
        raise UserError(flag, name, f"this machine has {n} CUDA GPU(s)", f"pass {flag} cuda:0 to cuda:{n - 1}")
    return dev


def check_one_gpu(plan, plan_path: str = "plan") -> None:
    """Refuse a plan over several GPUs (a pipeline split) before any file of the packed model is read."""
    if plan.n_gpus_used > 1:
        raise UserError(plan_path, "gpus", f"a plan over {plan.n_gpus_used} GPUs (a pipeline split); the engine "
                        "runs one GPU", "plan again for one GPU (strata-plan plan --gpus 1)")


def prompt_ids(packed: str | Path, context: int, text: str, max_new_tokens: int) -> list[int]:
    """The prompt's ids in the packed folder's tokenizer (`encode_prompt`), refused in one line when they and
    `max_new_tokens` do not fit the plan's `context` or the model's positions (`check_length`): what `run`
    calls before opening the engine, so a prompt too long costs no loading."""
    folder = Path(packed)
    cfg = ModelConfig.load(folder)
    ids = encode_prompt(load_tokenizer(folder), text, cfg, folder)
    check_length(len(ids), max_new_tokens, context, cfg.max_positions)
    return ids


@dataclass(frozen=True)
class EngineOptions:
    mode: str = "plan"
    device: str = ""                 # "" = cuda if available, else cpu
    backend: str = "auto"            # fused_moe backend: Triton on CUDA, the torch reference on CPU; "triton" on a
                                     # CPU: every kernel of the device loop interpreted (TRITON_INTERPRET=1, tests)
    allow_buffered: bool = True
    graphs: bool = True              # decode: one CUDA graph a token (device_loop.py); False: the eager forward
    tokens_per_graph: int = 4        # decode tokens a graph launch runs (device_loop.DeviceDecode.k): the host's
                                     # launch, token copy and wait shared by that many tokens; the host reads them
                                     # that many at a time
    copy_programs: int = 0           # thread blocks of the lookahead's copy kernel (0: kernels.prefetch.copy_programs;
                                     # a benchmark knob for the copy's effect on the main stream)
    partial_landing: bool = True     # a lookahead guess still copying serves the cache's fill the part that landed
                                     # (StoreOptions.partial_landing); False: whole experts only (A/B)
    stage_depths: str = "all"        # NVMe lookahead: the stager reads every depth's guesses, or the "deepest" alone
                                     # (StoreOptions.stage_depths; A/B)
    stager_io: str = field(default_factory=default_stager_io)   # the NVMe stager's reads: submitted together through
                                     # Linux native AIO ("aio", engine/aio.py) where the kernel gives it, else a
                                     # reader thread each ("threads": the reference, and the A/B)
    lookahead_point: str | None = None   # with an NVMe tier and lookahead, where the guesses for layers j+1.. are
                                     # taken: layer j's output, known when it ends (the traces' definition), or its
                                     # residual after attention ("attention": when its router runs, sent with its
                                     # request, a whole MoE layer sooner; tools/lookahead_point.py measures the
                                     # precision it costs). None: the plan's (`staging.lookahead_point`, which the
                                     # planner priced: Problem.lookahead_point)

    def __post_init__(self):
        if self.mode not in MODES:
            raise UserError("--mode", self.mode, "unknown", f"use one of {', '.join(MODES)}")
        if not 1 <= self.tokens_per_graph <= 64:
            raise UserError("--tokens-per-graph", str(self.tokens_per_graph), "out of range", "use 1 to 64")
        if self.stage_depths not in STAGE_DEPTHS:
            raise UserError("stage_depths", self.stage_depths, "unknown", f"use one of {', '.join(STAGE_DEPTHS)}")
        if self.stager_io not in STAGER_IO:
            raise UserError("stager_io", self.stager_io, "unknown", f"use one of {', '.join(STAGER_IO)}")
        if self.lookahead_point is not None and self.lookahead_point not in LOOKAHEAD_POINTS:
            raise UserError("lookahead_point", self.lookahead_point, "unknown",
                            f"use one of {', '.join(LOOKAHEAD_POINTS)}")
        # (where the kernel refuses an AIO context when the stager starts, it warns and reads with threads)


class Engine:
    def __init__(self, folder: Path, plan, store: ExpertStore, model: MoEModel, experts: StoreExperts,
                 options: EngineOptions):
        self.folder, self.plan, self.store, self.model, self.experts, self.opt = folder, plan, store, model, experts, options
        self.dense = None                    # engine.dense.DenseStream (set by `open`)

    @classmethod
    def open(cls, packed: str | Path, plan, options: EngineOptions = EngineOptions(), replay=None,
             plan_path: str = "plan") -> "Engine":
        """`plan`: a plan path or a loaded Plan. `replay`: an `engine.replay.Replay` (routing replayed)."""
        folder = Path(packed)
        device = resolve_device(options.device)
        if isinstance(plan, (str, Path)):
            plan_path, plan = str(plan), load_plan(plan)
        check_one_gpu(plan, plan_path)
        plan = baseline(plan, options.mode)
        host = host_units(plan, ModelConfig.load(folder), plan_path)     # dense weights kept in pinned RAM
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        store = ExpertStore.open(folder, plan, device, StoreOptions(prefetch=options.mode == "plan",
                                                                    partial_landing=options.partial_landing,
                                                                    stage_depths=options.stage_depths,
                                                                    stager_io=options.stager_io,
                                                                    lookahead_point=options.lookahead_point
                                                                    or plan.staging.point,
                                                                    allow_buffered=options.allow_buffered,
                                                                    kernels=options.backend == "triton"), plan_path)
        if store.prefetch is not None and options.copy_programs:
            store.prefetch.programs = options.copy_programs
        try:
            verify_dense(store.index)            # before any dense weight is read
            experts = StoreExperts(store, store.index.hidden, store.index.moe_intermediate,
                                   depth=plan.prefetch_depth if options.mode == "plan" else 0,
                                   backend=options.backend, replay=replay)
            model = MoEModel.load(folder, experts, context=plan.context, device=device, dtype=dtype, host=host)
            dense = DenseStream(model, store, plan, host, keep_routers=experts.depth > 0, plan_path=plan_path)
        except BaseException:
            store.close()
            raise
        experts.model = model
        model.fused_router = store.kernels       # the kernels run (a GPU, or interpreted): the router's and
        model.rope.fused = store.kernels         # the rotation's too
        if experts.depth:                    # lookahead: the gates' guesses, prefetched on the device
            model.after_moe = experts.after_moe
            if store.staging is not None and store.staging.early:     # the NVMe guesses taken at the router
                model.before_moe = experts.before_moe
        if options.graphs and model.before_layer is None:
            model.step_runner = DeviceDecode(model, experts, graphs=device.type == "cuda",
                                             tokens_per_graph=options.tokens_per_graph)
            model.step_runner.embed_in_place(dense.embed_address())
            model.step_runner.dense_step_bytes = dense.step_bytes()
        eng = cls(folder, plan, store, model, experts, options)
        eng.dense = dense
        return eng

    # ---- text ---------------------------------------------------------------------------------------
    def tokenizer(self):
        return load_tokenizer(self.folder)

    def encode(self, text: str) -> list[int]:
        return encode_prompt(self.tokenizer(), text, self.model.cfg, self.folder)

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, sampling: Sampling = Sampling(),
                 on_token: Callable[[int], None] | None = None) -> list[int]:
        return generate(self.model, prompt_ids, max_new_tokens, self.plan.prefill_chunk, sampling,
                        on_token=on_token)

    def close(self) -> None:
        """Stop the store's threads and free its pinned memory, the dense weights' and the step's CUDA graphs now, in
        this thread, and leave no reference cycle behind: what the garbage collector frees has its finalizers run in
        whichever thread set the collection off, maybe a later engine's stager while that engine's GPU waits for it
        (a registered region's release synchronizes the device)."""
        self.store.close()
        if self.model.step_runner is not None:
            self.model.step_runner.release()
        if self.dense is not None:
            self.dense.close()
        self.model.step_runner = self.model.after_moe = self.model.before_moe = None
        self.experts.model = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
