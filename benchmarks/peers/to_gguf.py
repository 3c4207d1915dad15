"""A Hugging Face checkpoint of ours to GGUF with llama.cpp's own converter (the vendored convert_hf_to_gguf.py).

    python benchmarks/peers/to_gguf.py CHECKPOINT OUT.gguf [--outtype bf16] [--llama-cpp benchmarks/peers/llama.cpp]

Our trained models use a byte-level BPE tokenizer of their own, whose pre-tokenizer the converter does not know
by its hash ("BPE pre-tokenizer was not recognized"); it is the GPT-2 one, so the converter is told so. Nothing
else of the conversion changes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("out")
    ap.add_argument("--outtype", default="bf16")
    ap.add_argument("--llama-cpp", default=str(HERE / "llama.cpp"))
    a = ap.parse_args(argv)
    root = Path(a.llama_cpp)
    sys.path[:0] = [str(root / "gguf-py"), str(root)]
    import convert_hf_to_gguf as convert
    from conversion.base import TextModel

    known = TextModel.get_vocab_base_pre

    def pre_tokenizer(self, tokenizer) -> str:
        try:
            return known(self, tokenizer)
        except NotImplementedError:
            return "gpt-2"                  # our byte-level BPE splits as GPT-2's does
    TextModel.get_vocab_base_pre = pre_tokenizer
    sys.argv = ["convert_hf_to_gguf.py", a.checkpoint, "--outfile", a.out, "--outtype", a.outtype]
    convert.main()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
