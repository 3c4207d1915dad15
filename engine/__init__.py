"""Engine: executes a plan (tiered expert store, prefetch, decode loop). Built on the plan and format schemas."""
