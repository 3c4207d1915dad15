"""strata-plan: run and plan Mixture-of-Experts models far bigger than one GPU (GPU + pinned RAM + NVMe).

Subpackages (each a top-level folder of the repository, installed under this namespace):
`strata_plan.planner` (model specs, routing statistics, cost model, search), `strata_plan.profiler`
(measure a machine), `strata_plan.profiles` (hardware-profile schema and the shipped rigs),
`strata_plan.kernels` (packed formats, quantizer, Triton kernels), `strata_plan.engine` (execution).
"""
__version__ = "0.1.0"
