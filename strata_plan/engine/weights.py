"""Dense (non-routed) tensors by their checkpoint names, from a packed folder (`dense.safetensors`, see
`strata_plan.engine.pack`), a Hugging Face checkpoint folder (`model.safetensors` or its sharded index)
or one safetensors file. Each tensor is read when asked for and moved to the device in the dtype asked."""
from __future__ import annotations

from pathlib import Path

import torch

from strata_plan.errors import UserError


class TensorSource:
    """name -> tensor of a safetensors file, a packed folder or a checkpoint folder."""

    def __init__(self, path: str | Path):
        from strata_plan.engine.pack import Checkpoint
        p = Path(path)
        self.path = p
        if p.is_file():
            self._files = {n: p for n in _keys(p)}
        elif (p / "dense.safetensors").exists():
            self._files = {n: p / "dense.safetensors" for n in _keys(p / "dense.safetensors")}
        else:
            self._files = dict(Checkpoint(p).where)
        self._open: dict[Path, object] = {}

    @property
    def names(self) -> set[str]:
        return set(self._files)

    def __contains__(self, name: str) -> bool:
        return name in self._files

    def get(self, name: str, device="cpu", dtype: torch.dtype | None = None) -> torch.Tensor:
        from safetensors import safe_open
        if name not in self._files:
            raise UserError(str(self.path), name, "tensor missing", "use the checkpoint (or packed folder) this "
                            "config.json belongs to")
        f = self._files[name]
        if f not in self._open:
            self._open[f] = safe_open(str(f), "pt")
        t = self._open[f].get_tensor(name)
        if t.dtype in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)):
            raise UserError(str(f), name, f"stored as {t.dtype}", "pack the checkpoint first (`strata-plan pack` "
                            "dequantizes FP8 block weights)")
        return t.to(device=device, dtype=dtype or t.dtype)

    def first(self, names: list[str], device="cpu", dtype: torch.dtype | None = None) -> torch.Tensor:
        """The first of `names` that exists (checkpoints spell a few tensors two ways)."""
        for n in names:
            if n in self._files:
                return self.get(n, device, dtype)
        return self.get(names[0], device, dtype)       # raises, naming the first spelling


def _keys(path: Path) -> list[str]:
    from safetensors import safe_open
    with safe_open(str(path), "pt") as f:
        return list(f.keys())
