"""Training real MoE language models (DeepSeek-V3 / Kimi-K2 family) on Python sources and extracting their
routing traces; `benchmarks/train_moe.py` is the command line."""
