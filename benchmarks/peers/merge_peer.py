"""One results file of the peer rows measured in several calls on one checkpoint (`run_peer_gpu.sh` holds two pairs a
call; the second call, on the machine still warm, reuses the first one's build and trained model):

    python benchmarks/peers/merge_peer.py benchmarks/results/peer-llama-cpp-A.json peer-llama-cpp-B.json
    # -> benchmarks/results/peer-llama-cpp-<now>.json: every row, `sources` naming the files merged

The files must be of one commit, one GPU and one budget and text (their `budget.*` and `text.*` metrics equal);
a metric measured twice is refused. Nothing is re-measured: the merged file's `command` lists the calls' commands
and `sources` their files, dates and machines. Exit 2 with one line when they do not belong together."""
from __future__ import annotations

import datetime as dt
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "results"
SHARED = ("budget.", "text.")          # the calls' common setting: equal in every file


def merge(files: list[Path]) -> dict:
    """The merged result of `files` (a ValueError naming the file and the field when they do not belong together)."""
    data = [json.loads(f.read_text()) for f in files]
    first = data[0]
    out = {"benchmark": "peer-llama-cpp", "git_sha": first["git_sha"], "machine": first["machine"], "metrics": {},
           "runs": {}, "errors": [], "sources": []}
    for f, d in zip(files, data):
        for field in ("benchmark", "git_sha"):
            if d.get(field) != first.get(field):
                raise ValueError(f"{f}: {field} {d.get(field)!r} is not {files[0].name}'s {first.get(field)!r}")
        if d["machine"].get("gpu") != first["machine"].get("gpu"):
            raise ValueError(f"{f}: machine.gpu {d['machine'].get('gpu')!r} is not {first['machine'].get('gpu')!r}")
        for k, v in d["metrics"].items():
            if k.startswith(SHARED):
                if out["metrics"].setdefault(k, v) != v:
                    raise ValueError(f"{f}: metrics.{k} {v!r} differs from the other files' {out['metrics'][k]!r}")
            elif k in out["metrics"]:
                raise ValueError(f"{f}: metrics.{k} is measured in two files; merge calls of different rows")
            else:
                out["metrics"][k] = v
        out["runs"].update(d.get("runs", {}))
        out["errors"] += d.get("errors", [])
        out["sources"].append({"file": f.name, "date": d["date"], "command": d["command"], "machine": d["machine"]})
    out["command"] = " ; ".join(s["command"] for s in out["sources"])
    out["notes"] = ("The rows of " + ", ".join(s["file"] for s in out["sources"]) + " (one checkpoint, one machine "
                    "session), merged by benchmarks/peers/merge_peer.py; each file's own notes: "
                    + " | ".join(d.get("notes", "") for d in data))
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("merge_peer.py: pass two or more peer-llama-cpp-*.json files", file=sys.stderr)
        return 2
    files = [Path(a) for a in argv]
    try:
        missing = next((f for f in files if not f.is_file()), None)
        if missing:
            raise ValueError(f"{missing}: not found")
        out = merge(files)
    except (ValueError, KeyError, json.JSONDecodeError) as e:
        print(f"merge_peer.py: {e}", file=sys.stderr)
        return 2
    now = dt.datetime.now(dt.timezone.utc)
    out = {"date": now.isoformat(timespec="seconds"), **out}
    path = RESULTS / f"peer-llama-cpp-{now.strftime('%Y%m%dT%H%M%SZ')}.json"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(out, indent=2) + "\n")
    os.replace(tmp, path)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
