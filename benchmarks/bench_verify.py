"""Benchmark: what checking every byte costs, against the NVMe read it must not slow.

1. One core: `hashlib` sha256 (SHA-NI where the CPU has it), blake2b and blake2s over a --mib buffer (best of 3).
2. Per part, as the engine checks (engine/packed.py, PART_BYTES = 1 MiB parts, each hashed on its own thread:
   hashlib releases the interpreter lock): sha256 of the buffer's parts on 1, 2, 4, ... up to the usable cores.
3. On this machine's disk (--dir): the store's own NVMe path (`transfer.Transfers`, O_DIRECT reads split as the
   plan says, into --bounce buffers, then copied) over a file of --blobs blobs of --blob-mib, with every part
   checked (a blob's first read in a run) and unchecked (later reads), beside plain O_DIRECT reads of the same
   blobs with the same threads (`directio.plain_read_gbps`); the three interleaved for --rounds rounds after one
   uncounted warm-up round, medians reported (a virtual disk's rate wanders from run to run). Page cache
   bypassed (O_DIRECT); GB = 1e9.
The rates to beat: the shipped profiles' NVMe figures (printed), up to ~14 GB/s for a Gen5 drive.

    python benchmarks/bench_verify.py [--mib 512] [--dir /var/tmp] [--blobs 48] [--blob-mib 18.5] [--readers 8]
                                      [--split 4] [--bounce N] [--rounds 3] [--hashers 16,4]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _result import write_result  # noqa: E402


def best_rate(nbytes: int, fn, reps: int = 3) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def hash_metrics(mib: int) -> dict:
    """Parts 1 and 2 of the module docstring."""
    from strata_plan.engine.packed import PART_BYTES, hash_threads
    buf = memoryview(os.urandom(mib << 20))
    out = {}
    for name in ("sha256", "blake2b", "blake2s"):
        h = getattr(hashlib, name)
        out[f"{name}_GBps_one_core"] = round(best_rate(len(buf), lambda: h(buf).digest()), 3)
        print(f"{name:8s} one core: {out[f'{name}_GBps_one_core']:.2f} GB/s (measured)")
    parts = [buf[a:a + PART_BYTES] for a in range(0, len(buf), PART_BYTES)]
    cores = hash_threads()
    threads = sorted({t for t in (1, 2, 4, 8, 16, 32, 64) if t <= cores} | {cores})
    for t in threads:
        with ThreadPoolExecutor(t) as pool:
            r = best_rate(len(buf), lambda: list(pool.map(lambda p: hashlib.sha256(p).digest(), parts)))
        out[f"sha256_parts_GBps_{t}_threads"] = round(r, 3)
        print(f"sha256 of {PART_BYTES >> 20} MiB parts on {t:2d} threads: {r:.2f} GB/s (measured)")
    out["usable_cores"] = cores
    return out


def store_metrics(folder: Path, blobs: int, blob_bytes: int, readers: int, split: int, rounds: int,
                  hashers: list[int], bounce: int = 0) -> dict:
    """Part 3 of the module docstring, the checked reads with each of `hashers` hashing threads."""
    import statistics
    import sys

    import torch

    from strata_plan.engine.directio import BlobFile, plain_read_gbps
    from strata_plan.engine.files import part_digests
    from strata_plan.engine.packed import PART_BYTES
    from strata_plan.engine.transfer import Fetch, Transfers
    blob_bytes = -(-blob_bytes // 4096) * 4096
    path = folder / "bench-verify.bin"
    digests = []
    with open(path, "wb") as f:
        for _ in range(blobs):
            data = os.urandom(blob_bytes)
            digests.append(tuple(part_digests(data, PART_BYTES)))
            f.write(data)
        os.fsync(f.fileno())
    in_flight = bounce or max(2, 2 * readers // split)
    out = {"blobs": blobs, "blob_bytes": blob_bytes, "readers": readers, "split": split, "rounds": rounds,
           "bounce_buffers": in_flight}
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    chunk = -(-blob_bytes // split // 4096) * 4096
    configs = [f"checked_{h}_hashers" for h in hashers] + ["unchecked"]
    rates: dict[str, list[float]] = {c: [] for c in configs + ["plain"]}
    bf = BlobFile.open(path, warn=False)
    old_switch = sys.getswitchinterval()
    sys.setswitchinterval(2e-4)                 # as the store sets it
    try:
        out["o_direct"] = bf.direct
        arena = torch.empty(in_flight * blob_bytes, dtype=torch.uint8, device=dev)
        ts = {c: Transfers(arena, bounce_slots=in_flight, slot_bytes=blob_bytes, readers=readers,
                           hashers=h) for c, h in zip(configs, hashers + [1])}
        try:
            for r in range(rounds + 1):             # round 0: a warm-up, not counted (the file was just written)
                for c, t in ts.items():
                    checked = c != "unchecked"
                    fetches = []
                    t0 = time.perf_counter()
                    for i in range(blobs):
                        f = Fetch(0, i, (i % in_flight) * blob_bytes, blob_bytes, demand=True, file=bf,
                                  file_offset=i * blob_bytes, split=split)
                        if checked:
                            f.parts, f.part_bytes = digests[i], PART_BYTES
                        fetches.append(t.submit(f))
                    for f in fetches:
                        f.wait_enqueued()
                    if dev.type == "cuda":
                        torch.cuda.synchronize(dev)
                    if r:
                        rates[c].append(blobs * blob_bytes / (time.perf_counter() - t0) / 1e9)
                if not r:
                    continue
                rates["plain"].append(plain_read_gbps([path], chunk, readers, blobs * blob_bytes))
                print("round: " + ", ".join(f"{k} {v[-1]:.2f} GB/s" for k, v in rates.items()))
        finally:
            for t in ts.values():
                t.close()
    finally:
        sys.setswitchinterval(old_switch)
        bf.close()
    med = {k: statistics.median(v) for k, v in rates.items()}
    out.update({f"store_fetch_GBps_{c}": round(med[c], 3) for c in configs})
    out.update({"plain_o_direct_GBps": round(med["plain"], 3),
                "rounds_GBps": {k: [round(x, 3) for x in v] for k, v in rates.items()}})
    print(f"store NVMe fetches ({readers} readers, split {split}, {in_flight} bounce buffers), medians of "
          f"{rounds} (measured): " + ", ".join(f"{c} {med[c]:.2f} GB/s" for c in configs)
          + f"; plain O_DIRECT reads of {chunk >> 10} KiB on {readers} threads {med['plain']:.2f} GB/s")
    path.unlink()
    return out


def profile_nvme_rates() -> dict:
    """The highest NVMe read figure of each shipped profile (GB/s): the rates a check must keep up with."""
    import yaml

    from strata_plan.profiles.schema import PROFILES_DIR
    out = {}
    for p in sorted(Path(PROFILES_DIR).glob("*.yaml")):
        d = yaml.safe_load(p.read_text())
        pts = [pt[2] for n in d.get("nvme") or [] for k in ("rand_read", "seq_read") if n.get(k)
               for pt in n[k]["points"]]
        if pts:
            out[p.stem] = max(pts)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=512, help="hashed buffer, MiB (default 512)")
    ap.add_argument("--dir", default="/var/tmp", help="folder on the disk to read (default /var/tmp); '' skips part 3")
    ap.add_argument("--blobs", type=int, default=48, help="blobs read in part 3 (default 48)")
    ap.add_argument("--blob-mib", type=float, default=18.5,
                    help="blob size, MiB (default 18.5: a kimi-k3.1-pro expert)")
    ap.add_argument("--readers", type=int, default=8, help="reader threads (default 8)")
    ap.add_argument("--split", type=int, default=4, help="read requests a blob (default 4)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of part 3 (default 3)")
    ap.add_argument("--bounce", type=int, default=0, help="bounce buffers (blobs read or checked at once; default "
                    "2 x readers / split, the store's ratio for the kimi plans: 16 for 32 readers at split 4)")
    ap.add_argument("--hashers", default="", help="hashing threads of the checked reads, comma-separated (default: "
                    "the usable cores, as the store uses)")
    ap.add_argument("--out-dir", help="results folder (default benchmarks/results)")
    args = ap.parse_args()
    metrics = {"load_avg_1min_at_start": round(os.getloadavg()[0], 2)}
    metrics.update(hash_metrics(args.mib))
    rates = profile_nvme_rates()
    metrics["profile_nvme_max_GBps"] = rates
    print("shipped profiles' NVMe read figures (GB/s): " + ", ".join(f"{k} {v:g}" for k, v in rates.items()))
    if args.dir:
        with tempfile.TemporaryDirectory(dir=args.dir) as d:
            from strata_plan.engine.packed import hash_threads
            hashers = [int(h) for h in args.hashers.split(",")] if args.hashers else [hash_threads()]
            metrics.update(store_metrics(Path(d), args.blobs, int(args.blob_mib * (1 << 20)), args.readers, args.split,
                                         args.rounds, hashers, args.bounce))
    path = write_result("verify", metrics, out_dir=args.out_dir,
                        notes="hash rates and fetch rates measured on this machine; profile_nvme_max_GBps are the "
                              "shipped profiles' figures (measured or assumed, as each profile says)")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
