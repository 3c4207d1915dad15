"""Compile every Triton kernel for a GPU target on a machine without one (no driver needed).

    STRATA_TRITON_COMPILE_ONLY=1 python -m strata_plan.kernels.compile_check [--arch 80,89,90,120] [--quick]

The architectures are those of every GPU the hardware profiles name: sm_80 (A100), sm_89 (RTX 4090),
sm_90 (H100 / H200; also the Gluon GEMM, Hopper only) and sm_120 (RTX 5090, RTX PRO 6000). --quick
builds one format of the single-format kernels and the MoE kernels at their shipped settings only (what
CI runs for every architecture); without it, every format and every config the libraries can select.

The interpreter (TRITON_INTERPRET=1) runs the kernels' Python, but it forgives things the compiler does
not (a Python global read inside a jitted function, a type mismatch between branches); this builds the
real PTX and cubin with Triton's bundled ptxas and prints what each kernel uses. Needs the variable
above set before the kernels are imported (otherwise they are interpreted on a machine with no GPU).
Registers and SASS depend on the Triton version: to read what the GPU machine runs, put its version first
on the path (`pip install --no-deps --target /tmp/t36 triton==3.6.0`, then PYTHONPATH=/tmp/t36).
"""
from __future__ import annotations

import argparse
import sys
import time

from .triton_common import INTERPRET, format_constants

P = {"u8": "*u8", "i8": "*i8", "i16": "*i16", "i32": "*i32", "i64": "*i64", "f16": "*fp16", "bf16": "*bf16", "f32": "*fp32"}


def _compile(fn, sig: dict, consts: dict, arch: int, num_warps: int = 4, num_stages: int = 3,
             maxnreg: int | None = None):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    sig = {**sig, **{k: "constexpr" for k in consts}}
    # pointers 16-byte aligned and ints divisible by 16, as the JIT specializes real launches
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a, t in sig.items() if t != "constexpr"}
    return triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages,
                                   **({"maxnreg": maxnreg} if maxnreg else {})})


def kernels(arch: int = 90, quick: bool = False, fmask: int = 31, smoke: bool = False):
    """(name, compiled kernel) for every kernel, at the formats and configs that exercise all branches.
    quick: one format of the single-format kernels; fmask: the format codes the MoE kernels carry (31:
    all five; 7 is the benchmark's tier mix); smoke: only the decode kernels the engine calls every token
    (the GEMV of one format, the fused MoE's two launches at their shipped settings): CI's check of the
    architectures other than sm_90."""
    from . import triton_gemm, triton_gemv, triton_moe
    out = []
    if smoke:
        return _decode_kernels(arch, fmask, ((1, 3),), (0,)) + _device_loop_kernels(arch)
    out.append(("quantize_x", _compile(
        triton_gemv.quantize_x_kernel,
        {"x_p": P["bf16"], "stride_xm": "i32", "K": "i32", "KPAD": "i32", "xq_p": P["i32"], "xdx_p": P["f32"],
         "xsum_p": P["f32"]}, dict(CHUNK=1024), arch)))
    out += _decode_kernels(arch, fmask, ((1, 3),) if quick else ((1, 0), (2, 3), (1, 3)),
                           (0,) if quick else range(5), gemm=True)
    blocks = {"order_p": P["i32"], "blk_e_p": P["i32"], "blk_start_p": P["i32"], "blk_cnt_p": P["i32"],
              "codes_p": P["i32"], "offs_p": P["i64"], "arena_p": P["u8"], "table_p": P["i64"]}
    out.append(("moe grouped gate_up", _compile(triton_gemm.grouped_gate_up, {
        "x_p": P["bf16"], "stride_xm": "i32", **blocks, "h_p": P["bf16"], "H": "i32", "I": "i32"},
        dict(TOPK=8, FMASK=fmask, BM=64, BN=128, BK=64, DQ=1, PFM=1, INTERP=False), arch)))
    out.append(("moe grouped down", _compile(triton_gemm.grouped_down, {
        "h_p": P["bf16"], "wts_p": P["f32"], **blocks, "y_p": P["f32"], "H": "i32", "I": "i32"},
        dict(FMASK=fmask, BM=64, BN=128, BK=64, DQ=1, PFM=1, INTERP=False), arch)))
    if arch == 90:                                  # Hopper only (wgmma): the Gluon prefill GEMM
        out += _gluon_kernels(arch, (0,) if quick else range(4))
    return out + _device_loop_kernels(arch)


def _device_loop_kernels(arch: int) -> list:
    """The device loop's small kernels (every token: the LRU step, the fill, the embedding gather) and the
    profiler's zero-copy probe."""
    from . import gate, gather, lru, norm, prefetch, rope, stage_wait, stream_read
    from .triton_common import tl
    i64 = P["i64"]
    st = {"static_p": P["i8"], "slot_expert_p": i64, "slot_stamp_p": i64, "slot_offset_p": i64, "n_slots_p": i64,
          "ram_offset_p": i64, "nbytes_p": i64, "table_p": i64, "admit_p": i64, "tick_p": i64, "counts_p": i64}
    return [
        ("lru step", _compile(lru.lru_step_kernel, {"ids_p": i64, "j": "i32", "E": "i32", "C": "i32", **st},
                              dict(K=8, KB=8, CB=64), arch, num_warps=1)),
        ("lru fill", _compile(lru.fill_kernel, {"arena_p": P["u8"], "ids_p": i64, "j": "i32", "E": "i32",
                                                "admit_p": i64, "ram_offset_p": i64, "nbytes_p": i64,
                                                "tail_p": i64, "split_p": i64},
                              dict(K=8, CHUNK=lru.FILL_CHUNK, HAS_TAIL=True), arch)),
        ("gather rows", _compile(gather.gather_rows_kernel, {"arena_p": P["u8"], "offset": "i64", "ids_p": i64,
                                                             "out_p": P["i16"], "H": "i32"},
                                 dict(BLOCK=gather.BLOCK), arch)),
        ("stream read", _compile(stream_read.stream_read_kernel, {"arena_p": P["u8"], "offset": "i64",
                                                                  "n_pairs": "i64", "out_p": i64},
                                 dict(BLOCK=stream_read.BLOCK), arch, num_warps=stream_read.NUM_WARPS)),
        *[(f"stage wait{', guesses at the router' if guess else ''}", _compile(stage_wait.stage_wait_kernel, {
            "arena_p": P["u8"], "ids_p": i64, "j": "i32", "L": "i32", "E": "i32", "seq_p": i64, "tier_p": P["i8"],
            "table_p": i64, "src_p": i64, "admit_p": i64, "nbytes_p": i64, "counts_p": i64, "words_at": "i64",
            "ready_at": "i64", "ring_at": "i64", "scores_at": "i64", "R": "i32", "cached_hi": "i64", "poison": "i64",
            "timeout_ns": "i64", "max_spins": "i64", "gids_p": i64, "gscores_p": P["f32"]},
            dict(K=8, KB=8, G=16, W=16, GB=16, HAS_SRC=True, HAS_ADMIT=True, HAS_GUESS=guess, GPU=True), arch,
            num_warps=1)) for guess in (False, True)],
        ("stage done", _compile(stage_wait.stage_done_kernel, {
            "arena_p": P["u8"], "seq_p": i64, "gids_p": i64, "gscores_p": P["f32"], "j": "i32", "L": "i32",
            "E": "i32", "tier_p": P["i8"], "table_p": i64, "words_at": "i64", "ring_at": "i64", "scores_at": "i64",
            "R": "i32", "cached_hi": "i64"},
            dict(K=8, G=32, W=16, GB=32, HAS_GUESS=True, GPU=True), arch, num_warps=1)),
        ("prefetch claim", _compile(prefetch.claim_kernel, {
            "gids_p": i64, "jj": "i32", "E": "i32", "state_p": i64, "where_p": i64, "assign_p": i64, "table_p": i64,
            "tier_p": P["i8"], "landed_p": P["i32"], "S": "i32", "NCH": "i32", "cached_hi": "i64"},
            dict(G=6, GB=8, SB=16, PARTIAL=True), arch, num_warps=1)),
        ("prefetch copy", _compile(prefetch.copy_kernel, {
            "arena_p": P["u8"], "gids_p": i64, "jj": "i32", "E": "i32", "assign_p": i64, "slot_offset_p": i64,
            "ram_rows_p": i64, "nbytes_p": i64, "counts_p": i64, "state_p": i64, "filled_p": i64, "done_p": i64,
            "landed_p": P["i32"], "n_chunks": "i32", "total": "i32", "P": "i32"},
            dict(CHUNK=prefetch.COPY_CHUNK, PARTIAL=True), arch)),
        ("rms norm", _compile(norm.rms_norm_kernel, {
            "x_p": P["bf16"], "stride_x": "i32", "w_p": P["bf16"], "out_p": P["bf16"], "D": "i32", "eps": "fp32"},
            dict(XDT=tl.bfloat16, ODT=tl.bfloat16, BD=8192), arch, num_warps=8)),
        ("rope", _compile(rope.rope_kernel, {
            "x_p": P["bf16"], "sx_t": "i32", "sx_h": "i32", "cos_p": P["bf16"], "sin_p": P["bf16"], "at_p": i64,
            "out_p": P["bf16"], "H": "i32"}, dict(HALF=32, BHALF=32, BH=128, INTERLEAVE=True, XDT=tl.bfloat16), arch)),
        ("lookahead gate logits", _compile(gate.gate_logits_kernel, {
            "x_p": P["bf16"], "norm_p": P["bf16"], "w_p": P["f32"], "out_p": P["f32"], "H": "i32", "E": "i32",
            "eps": "fp32"}, dict(XDT=tl.bfloat16, ROUND_LOGITS=False, BE=4, BH=1024), arch)),
        ("lookahead gate top-k", _compile(gate.gate_topk_kernel, {
            "logits_p": P["f32"], "bias_p": P["f32"], "ids_p": i64, "scores_p": P["f32"], "E": "i32",
            "scaling": "fp32"}, dict(SIGMOID=True, HAS_BIAS=True, NG=8, TG=4, NORM=True, ROUND_W=False,
                                    XDT=tl.bfloat16, K=8, KB=8, EB=256), arch)),
        ("prefetch resolve", _compile(prefetch.resolve_kernel, {
            "ids_p": i64, "j": "i32", "E": "i32", "state_p": i64, "where_p": i64, "slot_offset_p": i64,
            "table_p": i64, "src_p": i64, "tier_p": P["i8"], "nbytes_p": i64, "counts_p": i64, "guessed_p": i64,
            "ram_rows_p": i64, "landed_p": P["i32"], "partial_p": P["i8"], "tail_p": i64, "split_p": i64,
            "used_p": i64, "cached_hi": "i64", "S": "i32", "NCH": "i32"},
            dict(K=6, KB=8, G=6, GB=8, SB=16, HAS_SRC=True, PARTIAL=True, CHUNK=prefetch.COPY_CHUNK), arch,
            num_warps=1)),
        ("prefetch resolve + lru step", _compile(prefetch.resolve_step_kernel, {
            "ids_p": i64, "j": "i32", "E": "i32", "state_p": i64, "where_p": i64, "slot_offset_p": i64,
            "table_p": i64, "src_p": i64, "tier_p": P["i8"], "nbytes_p": i64, "counts_p": i64, "guessed_p": i64,
            "ram_rows_p": i64, "landed_p": P["i32"], "partial_p": P["i8"], "tail_p": i64, "split_p": i64,
            "used_p": i64, "cached_hi": "i64", "S": "i32", "NCH": "i32", "C": "i32", "static_p": P["i8"],
            "slot_expert_p": i64, "slot_stamp_p": i64, "lru_slot_p": i64, "n_slots_p": i64, "admit_p": i64,
            "tick_p": i64, "lru_counts_p": i64},
            dict(K=8, KB=8, G=16, GB=16, SB=32, CB=64, PARTIAL=True, CHUNK=prefetch.COPY_CHUNK), arch, num_warps=1)),
        ("prefetch release", _compile(prefetch.release_kernel, {
            "j": "i32", "E": "i32", "state_p": i64, "where_p": i64, "slot_offset_p": i64, "ram_rows_p": i64,
            "table_p": i64, "src_p": i64, "tail_p": i64, "filled_p": i64, "used_p": i64, "counts_p": i64,
            "S": "i32"}, dict(SB=16, HAS_SRC=True, PARTIAL=True), arch, num_warps=1)),
    ]


def _decode_kernels(arch: int, fmask: int, moe_variants, codes, gemm: bool = False) -> list:
    """Phase A, the GEMV of each format code (and with gemm, the Triton GEMM's builds) and the fused MoE
    decode launches for each (SPLIT, CG) variant."""
    from . import triton_gemm, triton_gemv, triton_moe
    out = []
    for code in codes:
        c = format_constants(code)
        packed = c["BITS"] != 16
        sig = {"x_p": P["bf16"], "stride_xm": "i32", "codes_p": P["i32"] if packed else P["bf16"],
               "scales_p": P["f16"] if c["SCALE_BITS"] == 16 else P["u8"],
               "mins_p": P["f16"] if c["MIN_BITS"] == 16 else P["u8"], "d_p": P["f16"], "dmin_p": P["f16"],
               "xq_p": P["i32"], "xdx_p": P["f32"], "xsum_p": P["f32"], "part_p": P["f32"], "cnt_p": P["i32"],
               "out_p": P["bf16"], "stride_om": "i32",
               "M": "i32", "N": "i32", "K": "i32", "WSPLIT": "i32"}
        consts = {k: c[k] for k in ("BITS", "GROUP", "SCALE_BITS", "MIN_BITS", "SB")}
        out.append((f"gemv code={code}", _compile(triton_gemv.gemv_kernel, sig, dict(
            consts, BN=64, BK16=128, SPLIT=2, CHUNK=512, USE_ASM=True, CG=1), arch, num_warps=4)))
        gsig = {**sig, "codes_p": P["i32"] if packed else P["bf16"]}     # the GEMM reads codes as words too
        for k in ("xq_p", "xdx_p", "xsum_p", "part_p", "cnt_p", "WSPLIT"):
            gsig.pop(k)
        for dq in ((0, 1) if packed else (0,)) if gemm else ():   # DQ=1: bf16x2 dequantization, PFM with it
            out.append((f"gemm code={code} DQ={dq}", _compile(triton_gemm.gemm_kernel, gsig, dict(
                consts, BM=128, BN=128, BK=64, GROUP_M=8, EVEN_K=True, INTERP=False, DQ=dq, PFM=dq), arch,
                num_stages=4)))
    arena = {"ids_p": P["i32"], "codes_p": P["i32"], "offs_p": P["i64"], "arena_p": P["u8"], "table_p": P["i64"]}
    # SPLIT: K splits; CG: the K loop's code generation (0: the defaults; 3: the H200's shipped options)
    for split, cg in moe_variants:
        tag = f"FMASK={fmask} SPLIT={split} CG={cg}"
        out.append((f"moe gate_up {tag}", _compile(triton_moe.gate_up_kernel, {
            "x_p": P["bf16"], "stride_xm": "i32", **arena, "xq_p": P["i32"], "xdx_p": P["f32"], "xsum_p": P["f32"],
            "hq_p": P["i32"], "hdx_p": P["f32"], "hsum_p": P["f32"], "hf_p": P["f32"], "gpart_p": P["f32"],
            "cnt_p": P["i32"], "M": "i32", "H": "i32", "I": "i32", "KU": "i32"},
            dict(TOPK=8, FMASK=fmask, BN=64, SPLIT=split, BK16=128, CHUNK=1024, USE_ASM=True, CG=cg),
            arch, 4)))
        out.append((f"moe down {tag}", _compile(triton_moe.down_kernel, {
            "ids_p": P["i32"], "wts_p": P["f32"], **{k: v for k, v in arena.items() if k != "ids_p"},
            "hq_p": P["i32"], "hdx_p": P["f32"], "hsum_p": P["f32"], "hf_p": P["f32"], "part_p": P["f32"],
            "cnt_p": P["i32"], "out_p": P["bf16"], "stride_om": "i32", "H": "i32", "I": "i32",
            "KU": "i32"}, dict(TOPK=8, FMASK=fmask, BN=64, SPLIT=split, BK16=128, USE_ASM=True, CG=cg),
            arch, 4)))
    return out


def _gluon_kernels(arch: int, codes) -> list:
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    from . import gluon_gemm
    fn = gluon_gemm.gemm_gluon_kernel
    desc = mangle_type(gluon_gemm.x_descriptor(torch.empty(256, 512, dtype=torch.bfloat16), 256))
    out = []
    for code in codes:
        c = format_constants(code)
        sig = {"x_desc": desc, "codes_p": P["i32"], "scales_p": P["f16"] if c["SCALE_BITS"] == 16 else P["u8"],
               "mins_p": P["f16"] if c["MIN_BITS"] == 16 else P["u8"], "d_p": P["f16"], "dmin_p": P["f16"],
               "out_p": P["bf16"], "stride_om": "i32", "part_p": P["f32"], "cnt_p": P["i32"],
               "M": "i32", "N": "i32", "K": "i32", "P": "i32"}
        # as at run time with every int divisible by 16, except those the kernel does not specialize
        fixed = {fn.arg_names[a] if isinstance(a, int) else a for a in fn.do_not_specialize}
        attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a, t in sig.items()
                 if t.startswith("*") or (t == "i32" and a not in fixed)}
        consts = {k: c[k] for k in ("BITS", "GROUP", "SCALE_BITS", "MIN_BITS", "SB")} | dict(BT=256, NS=3)
        src = GluonASTSource(fn, {**sig, **{k: "constexpr" for k in consts}}, consts, attrs)
        out.append((f"gemm gluon code={code}",
                    triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": 4})))
    return out


def _cuobjdump(k, flag: str) -> str | None:
    """cuobjdump (bundled with Triton) run on a compiled kernel's cubin; None where it is not available."""
    import subprocess
    import tempfile
    from pathlib import Path

    import triton
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        return subprocess.run([str(tool), flag, f.name], capture_output=True, text=True).stdout


def stores(ptx: str) -> str:
    """Global stores in the PTX as "all/16-byte/8-byte" (a store left narrow where the data allows 16 bytes
    multiplies the store instructions: the Gluon GEMM's epilogue lost ~10% so once)."""
    st = [ln for ln in ptx.splitlines() if "st.global" in ln]
    wide = sum(1 for ln in st if any(w in ln for w in (".v4.b32", ".v4.f32", ".v2.b64")))
    eight = sum(1 for ln in st if any(w in ln for w in (".v2.b32", ".v2.f32", ".b64")) and ".v2.b64" not in ln)
    return f"{len(st)}/{wide}/{eight}"


def registers(k) -> int | None:
    """Registers a thread of the compiled kernel uses (they set how many programs an SM holds)."""
    import re
    out = _cuobjdump(k, "--dump-resource-usage")
    m = re.search(r"REG:(\d+)", out or "")
    return int(m.group(1)) if m else None


def sass_loop(k) -> tuple[int, int] | None:
    """(instructions, IDP instructions) in the longest loop of a compiled kernel's SASS (the K loop of
    the decode kernels), from the cuobjdump bundled with Triton; None where it is not available."""
    import re
    sass = _cuobjdump(k, "--dump-sass")
    if sass is None:
        return None
    ins = [ln.split("*/", 1)[1].split(";")[0].strip() for ln in sass.splitlines()
           if ln.strip().startswith("/*") and "*/" in ln]
    ins = [i for i in ins if i]
    best = None
    for end, i in enumerate(ins):            # SASS instructions are 16 bytes: a target's index is addr / 16
        m = re.search(r"BRA (?:`\(.*\) )?0x([0-9a-f]+)", i)
        if m and int(m.group(1), 16) // 16 < end:
            span = (int(m.group(1), 16) // 16, end)
            best = span if best is None or span[1] - span[0] > best[1] - best[0] else best
    if best is None:
        return None
    body = ins[best[0]:best[1] + 1]
    return len(body), sum(1 for i in body if "IDP" in i)


ARCHS = (80, 89, 90, 120)      # A100; RTX 4090; H100 / H200; RTX 5090 / RTX PRO 6000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default=",".join(map(str, ARCHS)),
                    help="compute capabilities x10, comma-separated (default: every GPU the profiles name)")
    ap.add_argument("--quick", action="store_true",
                    help="one format of the single-format kernels, the MoE kernels at their shipped settings")
    ap.add_argument("--smoke", action="store_true",
                    help="only the decode GEMV (one format) and the fused MoE decode launches (CI, other archs)")
    ap.add_argument("--sass", action="store_true",
                    help="also count registers, and the SASS instructions (and DP4As) of each kernel's longest loop")
    ap.add_argument("--fmask", type=int, default=31,
                    help="format codes the MoE kernels carry, a bit mask (31: all; 7: the benchmark's tier mix)")
    a = ap.parse_args(argv)
    if INTERPRET:
        print("kernels are interpreted here: set STRATA_TRITON_COMPILE_ONLY=1 (and not TRITON_INTERPRET)")
        return 2
    for arch in (int(v) for v in a.arch.split(",")):
        t = time.time()
        for name, k in kernels(arch, a.quick, a.fmask, a.smoke):
            md = k.metadata
            loop = sass_loop(k) if a.sass else None
            regs = registers(k) if a.sass else None
            print(f"sm_{arch} {name:38s} shared {md.shared:6d} B  dp4a {k.asm['ptx'].count('dp4a'):4d}  "
                  f"wgmma {k.asm['ptx'].count('wgmma.mma_async'):3d}  cp.async {k.asm['ptx'].count('cp.async'):4d}  "
                  f"st.global {stores(k.asm['ptx'])}"
                  + (f"  regs {regs}" if regs else "") + (f"  loop: {loop[0]} SASS, {loop[1]} IDP" if loop else ""))
        print(f"all kernels compiled for sm_{arch} in {time.time() - t:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
