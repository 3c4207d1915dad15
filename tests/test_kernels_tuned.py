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
