"""The training text: Python sources found offline on the machine, split by file, and a byte-level BPE
tokenizer trained on the train split.

Files come from the interpreter's standard library and its installed packages. Identical files (vendored
copies) are kept once, and every file is put in train or held-out by a hash of its content, so a file and
its copies never straddle the split and the split does not depend on where the files are installed.
"""
from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

EOT = "<|endoftext|>"           # separates files in the token stream; id 0
HELD_OUT_PER_MILLE = 20         # 2% of files are held out
MAX_FILE_BYTES = 400_000        # larger .py files are generated tables, not code a model should learn


@dataclass(frozen=True)
class SourceFile:
    key: str        # "<root>/<path inside it>", for the record
    text: str

    @cached_property
    def digest(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    @property
    def held_out(self) -> bool:
        return int(self.digest[:8], 16) % 1000 < HELD_OUT_PER_MILLE

    @property
    def n_bytes(self) -> int:
        return len(self.text.encode("utf-8"))


@dataclass(frozen=True)
class Corpus:
    train: tuple[SourceFile, ...]      # in digest order (a fixed pseudo-random order)
    held_out: tuple[SourceFile, ...]

    @property
    def train_bytes(self) -> int:
        return sum(f.n_bytes for f in self.train)

    @property
    def held_out_bytes(self) -> int:
        return sum(f.n_bytes for f in self.held_out)

    def held_out_prefix(self, n_bytes: int) -> tuple[SourceFile, ...]:
        """The first held-out files (digest order) holding at least `n_bytes`, or all of them."""
        total = 0
        for i, f in enumerate(self.held_out):
            total += f.n_bytes
            if total >= n_bytes:
                return self.held_out[:i + 1]
        return self.held_out

    def summary(self) -> dict:
        return {"train_files": len(self.train), "train_bytes": self.train_bytes,
                "held_out_files": len(self.held_out), "held_out_bytes": self.held_out_bytes,
                "split": f"sha256(content) mod 1000 < {HELD_OUT_PER_MILLE} is held out"}


def python_source_roots() -> list[tuple[str, Path]]:
    """(label, folder) of the standard library and the installed packages of this interpreter."""
    paths = sysconfig.get_paths()
    roots: list[tuple[str, Path]] = []
    for label, key in (("stdlib", "stdlib"), ("purelib", "purelib"), ("platlib", "platlib")):
        p = Path(paths[key]).resolve()
        if p.is_dir() and all(p != r for _, r in roots):
            roots.append((label, p))
    return roots


def read_sources(roots: list[tuple[str, Path]], max_file_bytes: int = MAX_FILE_BYTES) -> list[SourceFile]:
    """Every readable UTF-8 `.py` file under the roots, once per content, in digest order. Installed-package
    folders nested in a root (site-packages inside the stdlib folder) are left to their own root."""
    nested = {r for _, r in roots}
    seen: set[str] = set()
    files: list[SourceFile] = []
    for label, root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            here = Path(dirpath)
            dirnames[:] = sorted(d for d in dirnames if (here / d).resolve() not in nested
                                 and d not in ("site-packages", "dist-packages", "__pycache__"))
            for name in sorted(filenames):
                if not name.endswith(".py"):
                    continue
                path = here / name
                try:
                    if path.stat().st_size > max_file_bytes or not path.is_file():
                        continue
                    text = path.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                if not text.strip():
                    continue
                f = SourceFile(f"{label}/{path.relative_to(root)}", text)
                if f.digest not in seen:
                    seen.add(f.digest)
                    files.append(f)
    files.sort(key=lambda f: f.digest)
    return files


def split(files: list[SourceFile], train_bytes_cap: int | None = None) -> Corpus:
    """Held-out files by content hash; the train split is cut at `train_bytes_cap` bytes (digest order)."""
    train, held = [], []
    total = 0
    for f in files:
        if f.held_out:
            held.append(f)
        elif train_bytes_cap is None or total < train_bytes_cap:
            train.append(f)
            total += f.n_bytes
    return Corpus(tuple(train), tuple(held))


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE tokenizer (GPT-2 style pre-tokenization, lossless round trip), EOT = id 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def encode_files(tok, files: tuple[SourceFile, ...] | list[SourceFile], chunk: int = 1024) -> list[np.ndarray]:
    """Token ids of each file (int32), without separators; encoded in parallel, a chunk of files at a time
    (an Encoding object per file is far larger than its ids)."""
    encode = tok.encode_batch_fast if hasattr(tok, "encode_batch_fast") else tok.encode_batch
    out: list[np.ndarray] = []
    for i in range(0, len(files), chunk):
        out += [np.asarray(e.ids, dtype=np.int32) for e in encode([f.text for f in files[i:i + chunk]])]
    return out


def stream(pieces: list[np.ndarray], eot_id: int = 0) -> np.ndarray:
    """One token stream: EOT before every file, as the model sees documents."""
    out = np.empty(sum(len(p) + 1 for p in pieces), dtype=np.int32)
    i = 0
    for p in pieces:
        out[i] = eot_id
        out[i + 1:i + 1 + len(p)] = p
        i += 1 + len(p)
    return out


def _byte_decoder() -> dict[str, int]:
    """The byte-level alphabet's inverse: printable stand-in character -> byte (GPT-2's mapping)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def token_byte_lengths(tok) -> np.ndarray:
    """UTF-8 bytes of text each token id stands for (special tokens count 0), for bits per byte."""
    dec = _byte_decoder()
    vocab = tok.get_vocab()
    special = {t.content for t in tok.get_added_tokens_decoder().values()}
    out = np.zeros(tok.get_vocab_size(), dtype=np.int64)
    for piece, i in vocab.items():
        out[i] = 0 if piece in special else sum(1 for ch in piece if ch in dec)
    return out
