"""tuned.config_for: named frozen configs, per-GPU data files, nearest-architecture fallback."""
import json
import logging

import pytest

from strata_plan.kernels import tuned


@pytest.fixture
def files(monkeypatch):
    """config_for over the given config files instead of the shipped ones (caches cleared around)."""
    def use(*data):
        monkeypatch.setattr(tuned, "config_files", lambda: tuple(data))
        tuned.gpu_entries.cache_clear()
        tuned._config.cache_clear()
    yield use
    tuned.gpu_entries.cache_clear()
    tuned._config.cache_clear()


def _gpu(monkeypatch, name, arch):
    monkeypatch.setattr(tuned, "_device_key", lambda device: (name, arch))


def test_shipped_files_are_valid_and_name_their_source():
    data = tuned.config_files()
    assert any(f["gpu"] == "NVIDIA H200" and f["arch"] == "sm_90" and "match" not in f for f in data)
    for f in data:
        assert f["source"] and set(f["configs"]) <= {"gemv", "gemm", "moe", "moe_grouped", "gemv:q4_g128_f16",
                                                     *(f"gemv:{k}" for k in ("q2_g16_s8m4", "q2_g32_s8m8",
                                                                            "q1_g32_s8m4", "bf16"))}
    # package data: the files ship with the package (pyproject's package-data)
    assert tuned.CONFIG_DIR.name == "configs" and list(tuned.CONFIG_DIR.glob("*.json"))


def test_gpu_entry_and_format_entry_layer_over_the_defaults(monkeypatch, files):
    files({"gpu": "NVIDIA Test GPU", "arch": "sm_90", "source": {"result": "r", "commit": "c"},
           "configs": {"gemv": {"rows": 32, "dp4a_block": True}, "gemv:q4_g128_f16": {"max_split": 16}}})
    _gpu(monkeypatch, "nvidia test gpu", "sm_90")
    q2 = tuned.config_for("gemv", "q2_g16_s8m4", 1, 3584, 7168, "cuda")
    q4 = tuned.config_for("gemv", "q4_g128_f16", 1, 3584, 7168, "cuda")
    assert q2 == tuned.GemvConfig(rows=32, dp4a_block=True) and q2.cg == 1
    assert q4 == tuned.GemvConfig(rows=32, dp4a_block=True, max_split=16)
    with pytest.raises(Exception):
        q4.rows = 0                                                  # frozen


def test_a_gpu_without_a_file_gets_its_architectures_with_one_line(monkeypatch, files, caplog):
    files({"gpu": "NVIDIA H200", "arch": "sm_90", "source": {},
           "configs": {"gemm": {"gluon": True, "gluon_min_m": 16}}},
          {"gpu": "NVIDIA H200 NVL", "arch": "sm_90", "source": {}, "configs": {"gemm": {"gluon": False}}})
    _gpu(monkeypatch, "nvidia h200", "sm_90")                        # the exact name: its own file, not the NVL's
    assert tuned.config_for("gemm", "q2_g16_s8m4", 2048, 3584, 7168, "cuda").gluon_min_m == 16
    _gpu(monkeypatch, "nvidia h200 nvl", "sm_90")                    # a name containing another's: its own
    assert not tuned.config_for("gemm", "q2_g16_s8m4", 2048, 3584, 7168, "cuda").gluon
    _gpu(monkeypatch, "nvidia h100 80gb hbm3", "sm_90")
    with caplog.at_level(logging.WARNING, logger="strata_plan.kernels"):
        a = tuned.config_for("gemm", "q2_g16_s8m4", 2048, 3584, 7168, "cuda")
        b = tuned.config_for("gemm", "q1_g32_s8m4", 512, 3584, 7168, "cuda")
    assert a.gluon and b.gluon and a.gluon_min_m == 16               # the H100 runs the H200's Gluon GEMM
    assert len([r for r in caplog.records if "h100" in r.getMessage()]) == 1
    _gpu(monkeypatch, "nvidia a100", "sm_80")                        # another architecture: the defaults
    assert tuned.config_for("gemm", "q2_g16_s8m4", 2048, 3584, 7168, "cuda") == tuned.GemmConfig()


def test_config_for_without_a_gpu_is_the_defaults():
    assert tuned.config_for("gemv", "q4_g128_f16", 1, 8, 64, "cpu") == tuned.GemvConfig()
    assert tuned.config_for("moe", "mix", 1, 8, 64, "cpu") == tuned.MoEConfig()
    assert tuned.config_for("gemm", "q2_g16_s8m4", 8, 8, 64, "cpu").block_m == 16      # small M: small tiles


def test_named_overrides_refuse_unknown_fields():
    base = tuned.MoEConfig()
    assert tuned.resolve("moe", {"split1": 3}, base) == tuned.MoEConfig(split1=3)
    with pytest.raises(ValueError, match="SPLIT1"):
        tuned.resolve("moe", {"SPLIT1": 3}, base)
    with pytest.raises(ValueError, match="unknown"):
        tuned.make("gemm", {"GLUON": 1})


def test_tuner_file_roundtrip(tmp_path):
    data = tuned.config_file("NVIDIA H200", "sm_90", {"moe": tuned.MoEConfig(split1=0, chunk=4096)},
                             "benchmarks/results/x.json", "abc1234")
    assert data["configs"] == {"moe": {"split1": 0, "chunk": 4096}}       # only what differs from the defaults
    p = tmp_path / "nvidia-h200.json"
    p.write_text(json.dumps(data))
    assert tuned.load_config_file(p)["source"] == {"result": "benchmarks/results/x.json", "commit": "abc1234"}


def test_gluon_warps_rule():
    # 8 warps (128-row tiles) only where both the rows and the reduction are long enough; 4 elsewhere
    from strata_plan.kernels import ops
    cfg = tuned.GemmConfig(gluon_warps=4, gluon_warps8_min_m=1024, gluon_warps8_min_k=7168)
    assert ops.gluon_warps(2048, 7168, cfg) == 8 and ops.gluon_warps(1024, 8192, cfg) == 8
    assert ops.gluon_warps(1023, 7168, cfg) == 4 and ops.gluon_warps(2048, 3584, cfg) == 4
    assert ops.gluon_warps(4096, 7168, tuned.GemmConfig()) == 4          # no rule: gluon_warps
    h200 = next(f for f in tuned.config_files() if f["gpu"] == "NVIDIA H200")
    shipped = tuned.make("gemm", h200["configs"]["gemm"])                # the shipped H200 entry carries the rule
    assert ops.gluon_warps(2048, 7168, shipped) == 8 and ops.gluon_warps(512, 7168, shipped) == 4
