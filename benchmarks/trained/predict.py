"""What the planner predicts for a placement the engine executed, and the physical bound of the bytes it
actually moved.

    p = Predictor("plan-ramrich.yaml")                  # the plan's recorded model, statistics and profile
    p.for_plan(executed_plan)   # {"decode_tok_s": ..., "source": ..., "bound_decode_tok_s": ..., ...}
    p.bound_from_bytes(executed_plan, pcie_bytes, nvme_bytes)   # tok/s no run moving these bytes can beat

Predictions: `planner.repredict.predict_plan`, the cost model re-run on the placement the engine ran in
each mode, with `profile` (a name, a YAML path or a HardwareProfile; default: the plan's own, by name). Every figure here is a prediction or a bound, never a measurement.
"""
from __future__ import annotations

from pathlib import Path


class Predictor:
    def __init__(self, plan_path: str | Path, profile=None, sampled: bool = False):
        from strata_plan.planner.cost import CostModel
        from strata_plan.core.plan import load_plan
        from strata_plan.planner.repredict import plan_problem
        self.path = str(plan_path)
        self.plan = load_plan(self.path)
        self.profile = profile or self.plan.sources.profile.name
        # sampled: the rows draw their tokens (temperature / top-p), whose GPU time the profile measured (`pick_us`)
        self.problem = plan_problem(self.plan, self.profile, self.path).replace(sampled=sampled)
        self.cost = CostModel(self.problem)

    def for_plan(self, executed, mode: str = "plan", stats=None, point: str | None = None) -> dict:
        """Predicted decode figures of `executed` (the plan as the engine ran it: another lookahead depth in the
        depth sweep) run as `mode`, and its physical bound (`planner.bound.physical_bound`, the optimistic bytes of the
        placement). `stats`: other routing statistics than the plan's (a row's own routing: `trained.run_routing`).
        `point`: where the NVMe lookahead took its guesses (EngineOptions.lookahead_point; None: the executed
        plan's, `staging.lookahead_point`)."""
        from strata_plan.planner.bound import physical_bound
        from strata_plan.planner.repredict import predict_plan
        from strata_plan.planner.placement import placement_of
        place = placement_of(executed)
        problem = self.problem if stats is None else self.problem.replace(stats=stats)
        point = point or executed.staging.point
        if point != problem.lookahead_point:
            problem = problem.replace(lookahead_point=point)
        pred = predict_plan(executed, None, mode, self.path, problem=problem)
        bound = physical_bound(problem, place)
        routing = "the plan's statistics" if stats is None else f"statistics of {stats.source}"
        if point != "output":       # the statistics' precision and recall are the layer's end's (no trace has others)
            routing += f", the NVMe guesses taken at lookahead point {point} with the layer's end's precision"
        return {"label": "predicted", "source": f"planner.repredict.predict_plan, profile {self.problem.profile.name}, "
                                                f"{routing}",
                "decode_tok_s": pred.decode_tok_s, "decode_binding": pred.decode_binding,
                "bytes_per_token": dict(pred.bytes_per_token), "vram_hit_rate": min(pred.hit_rate, 1.0),
                "decode_seconds": dict(pred.decode_seconds),
                "plan_own_decode_tok_s": self.plan.predicted.decode_tok_s,
                "bound_decode_tok_s": bound.decode_tok_s, "bound_decode_binding": bound.decode_binding,
                "bound_decode_bytes": dict(bound.decode_bytes)}

    def bound_from_bytes(self, executed, pcie_bytes: float, nvme_bytes: float) -> dict:
        """The physical bound of `executed` with the PCIe and NVMe bytes per token it actually moved (HBM bytes
        and FLOPs as `physical_bound` counts them), over each link's best profiled bandwidth."""
        from strata_plan.planner.bound import LINKS, link_peaks, physical_bound
        from strata_plan.planner.placement import placement_of
        amount = dict(physical_bound(self.problem, placement_of(executed)).decode_bytes)
        amount.update(pcie=float(pcie_bytes) + 2 * self.problem.spec.hidden, nvme=float(nvme_bytes))
        peaks = link_peaks(self.problem.profile)
        times = {k: amount[k] / peaks[k] if peaks[k] > 0 and amount[k] > 0 else 0.0 for k in LINKS}
        worst = max(LINKS, key=lambda k: times[k])
        return {"label": "bound (measured bytes over profiled peaks)", "decode_tok_s": 1.0 / times[worst],
                "binding": worst, "seconds_per_token": times, "peaks_gbps": {k: v / 1e9 for k, v in peaks.items()}}
