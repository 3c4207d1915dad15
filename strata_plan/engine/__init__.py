"""Engine: executes a plan. Its input stage today: `pack` (the `strata-plan pack` command: checkpoint or synthetic
weights to a packed folder), `packed` (reading and checking that folder: index, plan match, sha256), `fp8` (FP8
block-quantized checkpoints), `synthetic` (random weights in a model's geometry), `files` (atomic, hashed writes).
PACK.md documents the folder."""
