"""strata-plan: run and plan Mixture-of-Experts models far bigger than one GPU (GPU + pinned RAM + NVMe).

Subpackages: `core` (model specs, routing statistics, the plan file: what planner and engine share),
`planner` (cost model, bounds, search), `profiler` (measure a machine), `profiles` (hardware-profile schema
and the shipped rigs), `kernels` (packed formats, quantizer, Triton kernels), `engine` (execution), `cli`
and `tui`. ARCHITECTURE.md at the repository's root says which may import which.
"""
__version__ = "0.1.0"
