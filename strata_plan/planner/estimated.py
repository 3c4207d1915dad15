"""Estimated inputs: which figures of a prediction were not measured, which one binds it, and what the
same plan predicts with that input at a typical alternative.

A prediction rests on the profile's figures (NVMe reads, pinned H2D, HBM, bf16 TFLOPS), the kernel rates
(`rates.py`) and the calibration constants. Where the one behind the binding resource is an estimate, the
row's figure is only as good as that estimate: compare-tables prints it with the prediction of the same
placement at a typical alternative (`ALTERNATIVES`), and what-if lists the estimated inputs first.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

ALTERNATIVES = {
    "nvme": (7.0, "a 7 GB/s Gen4 NVMe"),
    "pcie": (25.0, "25 GB/s Gen4 x16 H2D"),
}
"""Link -> (best GB/s, what it is): the typical alternative a binding estimated link is re-predicted at. NVMe:
a Gen4 drive's sequential read (Samsung 990 PRO 7.45 GB/s, ../shared/reference/hardware-specs.md §4);
pinned H2D: Gen4 x16 as measured on RTX 4090 and A100 (23.9-26.2 GB/s, hardware-specs.md §2)."""


@dataclass(frozen=True)
class EstimatedInput:
    link: str               # the resource it sets: nvme, pcie, hbm, compute, overhead, peer (several GPUs)
    name: str
    value: str
    source: str


def estimated_inputs(problem) -> list[EstimatedInput]:
    """Every input of the cost model on this problem that is an estimate, by the resource it sets."""
    from strata_plan.planner.rates import decode_rates, expansion_rate
    prof = problem.profile
    gpu, cal = prof.gpu, prof.calibration
    out: list[EstimatedInput] = []
    if prof.nvme and prof.nvme[0].rand_read.provenance == "estimate":
        s = prof.nvme[0].rand_read
        out.append(EstimatedInput("nvme", "NVMe random reads", f"best {max(v for *_, v in s.points):.3g} GB/s", s.source))
    if gpu.h2d_pinned.provenance == "estimate":
        c = gpu.h2d_pinned
        out.append(EstimatedInput("pcie", "pinned H2D", f"best {max(v for _, v in c.points):.3g} GB/s", c.source))
    if problem.n_gpus > 1:                  # several GPUs: the host side's concurrent H2D, the peer link
        host = prof.concurrent_h2d()
        if host.provenance == "estimate":
            out.append(EstimatedInput("pcie", "concurrent H2D to all GPUs", f"{host.value:.3g} GB/s", host.source))
        peer = prof.peer
        for fig, what in ((peer.gbps, "peer link"), (peer.latency, "peer latency")):
            if fig is not None and fig.provenance == "estimate":
                unit = "GB/s" if what == "peer link" else "us"
                out.append(EstimatedInput("peer", f"{what} ({peer.kind})", f"{fig.value:g} {unit}", fig.source))
    rates = decode_rates(problem)
    est = [f for f, r in rates.items() if r.estimated]
    if est:
        r = rates[est[0]]
        out.append(EstimatedInput("hbm", "fused MoE decode rate", f"{r.value / 1e9:.0f} GB/s ({est[0]})", r.source))
    for fig, link, name in ((gpu.hbm_gbps, "hbm", "HBM read"), (gpu.bf16_tflops, "compute", "bf16 TFLOPS")):
        if fig.provenance == "estimate":
            out.append(EstimatedInput(link, name, f"{fig.value:g}", fig.source))
    ex = expansion_rate(problem)
    if ex.estimated:
        out.append(EstimatedInput("compute", "prefill expansion rate", f"{ex.value / 1e12:.2f} T weights/s", ex.source))
    for name, link in (("layer_overhead_us", "overhead"), ("moe_round_trip_us", "overhead"), ("hbm_efficiency", "hbm"),
                       ("compute_efficiency", "compute"), ("copy_overlap", "pcie"), ("dense_stream_efficiency", "pcie")):
        fig = cal.round_trip if name == "moe_round_trip_us" else getattr(cal, name)
        if fig.provenance == "estimate":
            out.append(EstimatedInput(link, f"calibration {name}", f"{fig.value:g}", fig.source))
    return out


def binding_estimate(problem, binding: str) -> EstimatedInput | None:
    """The first estimated input behind the binding resource of a prediction (None: measured or quoted)."""
    return next((e for e in estimated_inputs(problem) if e.link == binding), None)


def at_alternative(problem, placement, link: str):
    """(prediction of `placement` with `link` at its typical alternative, what the alternative is), or None
    when the link has no alternative here (or the profile has no such link)."""
    from strata_plan.planner.bound import link_peaks
    from strata_plan.planner.cost import CostModel
    if link not in ALTERNATIVES:
        return None
    best = link_peaks(problem.profile)[link] / 1e9
    if best <= 0:
        return None
    gbps, what = ALTERNATIVES[link]
    if abs(gbps / best - 1) < 0.02:
        what += " (the estimate already)"
    changed = problem.replace(profile=scale_links(problem.profile, **{link: gbps / best}))
    return CostModel(changed).predict(placement), what


def estimated_table(problem, predicted) -> list[dict]:
    """Rows of `estimated_inputs` for what-if, those behind a binding resource of `predicted` (a
    `Prediction` or a plan's `Predicted`) first."""
    binds = {predicted.decode_binding: "decode", predicted.prefill_binding: "prefill"}
    if predicted.decode_binding == predicted.prefill_binding:
        binds[predicted.decode_binding] = "decode, prefill"
    rows = [{"name": e.name, "value": e.value, "link": e.link, "binds": binds.get(e.link, ""), "source": e.source}
            for e in estimated_inputs(problem)]
    return sorted(rows, key=lambda r: not r["binds"])


def scale_links(profile, pcie: float = 1.0, nvme: float = 1.0, hbm: float = 1.0, compute: float = 1.0):
    """The same machine with faster (or slower) links: every curve and figure of a link times its factor (on
    every GPU; PCIe also scales the host side's concurrent H2D and the peer link)."""
    fig = lambda f, x: dataclasses.replace(f, value=f.value * x)  # noqa: E731
    gpus = tuple(dataclasses.replace(
        g, h2d_pinned=g.h2d_pinned.scaled(pcie),
        h2d_during_kernel=g.h2d_during_kernel.scaled(pcie) if g.h2d_during_kernel else None,
        zero_copy=g.zero_copy.scaled(pcie) if g.zero_copy else None,
        hbm_gbps=fig(g.hbm_gbps, hbm), bf16_tflops=fig(g.bf16_tflops, compute),
        kernel_gbps={k: fig(v, hbm) for k, v in g.kernel_gbps.items()}) for g in profile.gpus)
    drives = tuple(dataclasses.replace(d, rand_read=d.rand_read.scaled(nvme),
                                       seq_read=d.seq_read.scaled(nvme) if d.seq_read else None) for d in profile.nvme)
    topo = profile.topology
    if topo is not None:
        peer = topo.peer if topo.peer.gbps is None else dataclasses.replace(topo.peer, gbps=fig(topo.peer.gbps, pcie))
        host = dataclasses.replace(topo.host_links, concurrent_h2d_gbps=fig(topo.host_links.concurrent_h2d_gbps, pcie))
        topo = dataclasses.replace(topo, peer=peer, host_links=host)
    return dataclasses.replace(profile, gpus=gpus, nvme=drives, topology=topo)
