"""Profiler: measures a machine and writes its hardware profile."""
