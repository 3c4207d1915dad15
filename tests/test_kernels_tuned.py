"""tuned.config_for: defaults, a GPU's tuned entry, and a format's own entry over it."""
from strata_plan.kernels import tuned


def test_config_for_layers_gpu_and_format_entries(monkeypatch):
    monkeypatch.setattr(tuned, "_device_key", lambda device: "nvidia test gpu")
    monkeypatch.setattr(tuned, "TUNED", {"test gpu": {"gemv": {"BN": 32, "CG": 1},
                                                      "gemv:q4_g128_f16": {"MAXSPLIT": 16}}})
    q2 = tuned.config_for("gemv", "q2_g16_s8m4", 1, 3584, 7168, "cuda")
    q4 = tuned.config_for("gemv", "q4_g128_f16", 1, 3584, 7168, "cuda")
    assert q2 == {**tuned.DEFAULTS["gemv"], "BN": 32, "CG": 1}
    assert q4 == {**q2, "MAXSPLIT": 16}
    q4["BN"] = 0                                     # a fresh dict each call
    assert tuned.config_for("gemv", "q4_g128_f16", 1, 3584, 7168, "cuda")["BN"] == 32


def test_config_for_without_a_gpu_is_the_defaults():
    assert tuned.config_for("gemv", "q4_g128_f16", 1, 8, 64, "cpu") == tuned.DEFAULTS["gemv"]


def test_gluon_warps_rule():
    # 8 warps (128-row tiles) only where both the rows and the reduction are long enough; 4 elsewhere
    from strata_plan.kernels import ops
    cfg = {"GWARPS": 4, "GWARPS8_MIN_M": 1024, "GWARPS8_MIN_K": 7168}
    assert ops.gluon_warps(2048, 7168, cfg) == 8 and ops.gluon_warps(1024, 8192, cfg) == 8
    assert ops.gluon_warps(1023, 7168, cfg) == 4 and ops.gluon_warps(2048, 3584, cfg) == 4
    assert ops.gluon_warps(4096, 7168, {"GWARPS": 4}) == 4          # no rule: GWARPS
    h200 = tuned.TUNED["nvidia h200"]["gemm"]                        # the shipped H200 entry carries the rule
    assert ops.gluon_warps(2048, 7168, h200) == 8 and ops.gluon_warps(512, 7168, h200) == 4
