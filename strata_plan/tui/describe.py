"""Short human summaries of a hardware profile, a model and a plan, as (label, value) rows for the wizard.
No Textual here; every figure comes from the profile, `ModelSpec` or the plan, with its provenance."""
from __future__ import annotations

from strata_plan.units import fmt_bytes

MiB = 1 << 20
LAYER_READ = 128 * MiB      # the zero-copy row's read size: a MoE layer's RAM reads a token (kimi-k3.1-pro: ~100-200 MB)
TIERS = {"vram": "VRAM", "ram": "RAM", "nvme": "NVMe"}     # keys of Predicted.bytes_per_token


def _fig(f, unit: str, fmt: str = "{:g}") -> str:
    return f"{fmt.format(f.value)} {unit} ({f.provenance})"


def profile_rows(profile, borrowed: str = "") -> list[tuple[str, str]]:
    """GPU, link, RAM and disk figures the planner leans on most; `borrowed` names the shipped profile a
    host-only profile took its GPU from."""
    rows = []
    g = profile.gpu
    if g is None:
        rows.append(("GPU", "none (host-only profile): pick a shipped GPU to borrow"))
    else:
        n = len(profile.gpus)
        each = f"{n}x " if n > 1 else ""
        rows += [("GPU", f"{each}{g.name}, {_fig(g.vram_gb, 'GB')}" + (" each" if n > 1 else "")
                  + (f", borrowed from {borrowed}" if borrowed else "")),
                 ("HBM / BF16", f"{_fig(g.hbm_gbps, 'GB/s')}, {_fig(g.bf16_tflops, 'TFLOPS')}"),
                 ("pinned H2D", f"{g.h2d_pinned.at(16 * MiB):.1f} GB/s at 16 MiB ({g.h2d_pinned.provenance})"
                  + (f" each, x{g.pcie_width.value:g}" if n > 1 else ""))]
        if g.zero_copy is not None:         # kernels reading pinned RAM in place: the device loop's RAM experts
            rows.append(("zero-copy", f"{g.zero_copy.at(LAYER_READ):.1f} GB/s at {LAYER_READ // MiB} MiB "
                                      f"({g.zero_copy.provenance})" + (" each" if n > 1 else "")))
        if n > 1:
            rows.append(("GPU links", gpu_links_text(profile)))
    h = profile.host
    rows += [("RAM", f"{_fig(h.ram_gb, 'GB', '{:.0f}')}, pinnable {h.pinnable_gb.value:.0f} GB, "
                     f"copy {h.ram_gbps.value:.1f} GB/s")]
    if profile.nvme:
        d = profile.nvme[0]
        gbps, qd = d.rand_read.best(16 * MiB)
        rows.append(("NVMe", f"{d.name}, {d.capacity_gb.value:.0f} GB; random 16 MiB reads {gbps:.2f} GB/s "
                             f"at qd{qd} ({d.rand_read.provenance})"))
    else:
        rows.append(("NVMe", "none"))
    return rows


def gpu_links_text(profile) -> str:
    """How the GPUs of a several-GPU profile reach each other and the host."""
    peer, host = profile.peer, profile.concurrent_h2d()
    kind = {"none": "no peer-to-peer (through host memory)", "pcie": "PCIe peer-to-peer",
            "nvlink": "NVLink"}[peer.kind]
    rate = f" {_fig(peer.gbps, 'GB/s')}" if peer.gbps is not None else ""
    shared = profile.topology.host_links.shared_root_complex if profile.topology is not None else False
    return (f"{kind}{rate}; host links {'share a root complex' if shared else 'separate'}, "
            f"{_fig(host, 'GB/s')} H2D to all at once")


def model_rows(spec) -> list[tuple[str, str]]:
    from strata_plan.kernels.formats import tier_mix
    mix = tier_mix()
    return [("layers", f"{spec.n_layers} ({spec.n_moe_layers} MoE)"),
            ("experts", f"{spec.n_routed} routed, top-{spec.top_k} per token"),
            ("parameters", f"{spec.total_params / 1e9:.1f} B total, {spec.active_params / 1e9:.1f} B active"),
            ("packed size", f"{spec.packed_bytes(mix) / 1e9:.1f} GB in the tier mix "
                            f"({', '.join(mix.formats)}), dense BF16 {spec.dense_bytes / 1e9:.1f} GB")]


def fmt_tok(v: float) -> str:
    """tok/s with three significant digits, without exponents."""
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def plan_rows(plan) -> list[tuple[str, str]]:
    """Headline predictions of a plan: tok/s (labelled predicted) with the binding resource and the physical
    bound, decode bytes per token by tier, and where routed-expert reads are served from."""
    p = plan.predicted
    bpt = p.bytes_per_token or {}
    return [("decode", f"{fmt_tok(p.decode_tok_s)} tok/s predicted · binding: {p.decode_binding} · "
                       f"bound {fmt_tok(p.bound_decode_tok_s)} ({p.bound_decode_binding})"),
            ("prefill", f"{fmt_tok(p.prefill_tok_s)} tok/s predicted · binding: {p.prefill_binding} · "
                        f"bound {fmt_tok(p.bound_prefill_tok_s)} ({p.bound_prefill_binding})"),
            ("bytes/token", " · ".join(f"{name} {fmt_bytes(bpt.get(k, 0.0))}" for k, name in TIERS.items())
             + f" · over PCIe {fmt_bytes(bpt.get('pcie', 0.0))}"),
            ("expert reads", f"VRAM {p.vram_hit_rate:.1%} · RAM {p.ram_share:.1%} · NVMe {p.nvme_share:.1%}"),
            *([("GPUs", " · ".join(f"GPU {g.index}: layers {g.first_layer}..{g.end_layer - 1}"
                                   + (" + lm_head" if g.lm_head else "") + f", {sum((g.vram or {}).values()) / 1e9:.1f}"
                                   f" of {g.vram_budget_bytes / 1e9:g} GB" for g in plan.gpus))] if plan.gpus else [])]
