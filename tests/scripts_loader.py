"""Import helpers from scripts/ (not an installed package) for tests."""
import importlib.util
from pathlib import Path

_p = Path(__file__).resolve().parents[1] / "scripts" / "config_support.py"
_spec = importlib.util.spec_from_file_location("config_support", _p)
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
support_rows = _mod.support_rows
