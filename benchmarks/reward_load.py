"""The reward service under an RL trainer's load: batches of candidates through `/v1/evaluate/batch`, one at a time.

Usage:
    python benchmarks/reward_load.py --pack .corpus/corpus.jsonl --out load.json --markdown     # 3 batches of 128
    python benchmarks/reward_load.py --pack .corpus/corpus.jsonl --gpus 2 --per-gpu 4 --batches 5
    python benchmarks/reward_load.py --pack .corpus/corpus.jsonl --cluster ray                  # Ray actors' slots
    python benchmarks/reward_load.py --pack tiny.jsonl --device cpu --batch 4 --batches 2 --time-budget 0.1

A GRPO step sends prompts x completions candidates (8 x 16 = 128 by default) and waits for every verdict before
the next step. This script starts the service in-process: a `Pool` (or, with `--cluster`, a `RayPool`) behind
`create_app` with a random API key, served by uvicorn in a background thread on a loopback socket it bound itself
(in-process rather than `kernelcraft serve` in a subprocess: the script owns the pool's lifetime, sees its
protocol for the baselines' longer timeout and needs no port race or start-up polling). It then sends `--batches`
batches one after another through `kernelcraft.client.Client`.

Each batch draws `--batch` items of the pack (the format of `benchmarks/corpus_throughput.py pack`, read by its
`read_pack`) with replacement, seeded by `--seed`, and appends `# policy sample <batch>.<index>` to each
candidate's text, so every candidate in the run is distinct, as a policy's samples are: caches keyed on the
candidate's text (the pool's prebuild markers, the verdict's candidate_sha256) miss as they would in training; a
compiled extension whose own source is unchanged may still come from the build cache, as a resampled kernel would.

Recorded per verdict: item, status, speedup, the judge's own wall time and phases, and its latency: the client does
not stream, so a verdict's latency is its batch's (send to last verdict). Per batch: wall time, statuses, and the
GPUs' busy share = sum of the verdicts' `phases_s["time"]` (timed rounds, which have a GPU alone) / (wall x GPUs).
The JSON (`--out`) is rewritten after every batch and gets the service's `/v1/stats` at the end.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import random
import secrets
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import torch

from kernelcraft.client import Client, ServiceError
from kernelcraft.serve.pool import Pool
from kernelcraft.serve.service import DEFAULT_MAX_BATCH, DEFAULT_MAX_BODY, create_app

_spec = importlib.util.spec_from_file_location("corpus_throughput", Path(__file__).with_name("corpus_throughput.py"))
corpus = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(corpus)


def make_pool(args, device: str, cache_dir: str):
    """The service's pool: local slots on `--gpus` GPUs (or the CPU), or Ray actors with `--cluster`."""
    if args.cluster:
        from kernelcraft.serve.cluster import RayPool

        address = None if args.cluster in ("ray", "local") else args.cluster
        return RayPool(address, devices=device, gpus=args.gpus if device == "cuda" else 0, cache_dir=cache_dir,
                       per_gpu=args.per_gpu, cpu_timing=args.per_gpu or 2)
    devices = [f"cuda:{i}" for i in range(args.gpus)] if device == "cuda" else ["cpu"]
    return Pool(devices=devices, per_device=args.per_gpu, cache_dir=cache_dir)


class Service:
    """`create_app` over `pool`, served by uvicorn in a daemon thread on a loopback socket bound here."""

    def __init__(self, pool, *, api_key: str, max_batch: int, max_body: int):
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        app = create_app(pool, api_key=api_key, max_body_bytes=max_body, max_batch=max_batch)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_keep_alive=30))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise SystemExit("reward_load: the service did not start (see uvicorn's messages above)")
            time.sleep(0.05)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


def draw(pairs, batch: int, index: int, rng: random.Random) -> list[tuple[dict, object, str]]:
    """`batch` pack items drawn with replacement, each candidate's text made distinct by a trailing comment."""
    return [(row, task, row["code"].rstrip("\n") + f"\n# policy sample {index}.{i}\n")
            for i, (row, task) in enumerate(rng.choices(pairs, k=batch))]


def send(client: Client, pool, drawn, time_budget: float | None) -> tuple[list[dict], float]:
    """One batch through the service: (verdict records, wall seconds from send to the last verdict)."""
    base = {"time_budget_s": time_budget} if time_budget else {}
    items = [{"task": task.source, "candidate": code, "options": {**base, **corpus.baseline_timeout(row["kind"], pool)}}
             for row, task, code in drawn]
    t0 = time.monotonic()
    results = client.evaluate_batch(items)
    wall = time.monotonic() - t0
    if len(results) != len(drawn):
        raise SystemExit(f"reward_load: {len(drawn)} candidates sent, {len(results)} verdicts back")
    return [{"item": row["item"], "status": v["status"], "reasons": v.get("reasons", []), "speedup": v.get("speedup"),
             "latency_s": round(wall, 3), "wall_s": v.get("wall_s"), "phases_s": v.get("phases_s") or {}}
            for (row, _, _), v in zip(drawn, results)], wall


def summarize(batches: list[dict], gpus: int) -> dict:
    verdicts = [v for b in batches for v in b["verdicts"]]
    wall = sum(b["wall_s"] for b in batches)
    latency, batch_wall = [v["latency_s"] for v in verdicts], [b["wall_s"] for b in batches]
    judge = [v["wall_s"] for v in verdicts if isinstance(v["wall_s"], (int, float))]
    per_min = len(verdicts) / wall * 60 if wall > 0 else None
    return {"batches": len(batches), "candidates": len(verdicts), "wall_s": round(wall, 2),
            "verdict_latency_s": {"p50": corpus.pct(latency, 50), "p95": corpus.pct(latency, 95)},
            "batch_latency_s": {"p50": corpus.pct(batch_wall, 50), "p95": corpus.pct(batch_wall, 95)},
            "judge_wall_s": {"p50": corpus.pct(judge, 50), "p95": corpus.pct(judge, 95)},
            "per_min": round(per_min, 2) if per_min else None,
            "per_gpu_min": round(per_min / gpus, 2) if per_min else None,
            "busy_share": corpus.busy_share(verdicts, wall, gpus),
            "statuses": dict(Counter(v["status"] for v in verdicts))}


def run(args) -> int:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    gpus = args.gpus if device == "cuda" else 1
    pack_path = Path(args.pack)
    if not pack_path.is_file():
        raise SystemExit(f"reward_load: no pack file {pack_path} (make one with benchmarks/corpus_throughput.py pack)")
    try:
        pairs = corpus.read_pack(pack_path)
    except SystemExit as e:  # its messages speak as corpus_throughput's `run`
        raise SystemExit(f"reward_load: {str(e.code).removeprefix('run: ')}") from None
    if not pairs:
        raise SystemExit(f"reward_load: the pack {pack_path} holds no candidates")
    results = {"pack": str(pack_path), "pack_sha256": hashlib.sha256(pack_path.read_bytes()).hexdigest(),
               "device": device, "gpus": gpus, "per_gpu": args.per_gpu, "cluster": args.cluster,
               "batch": args.batch, "seed": args.seed, "time_budget_s": args.time_budget, "batch_results": []}
    out, rng = Path(args.out), random.Random(args.seed)
    largest = max(len(row["code"]) + len(task.source) for row, task in pairs)
    cache_dir = tempfile.mkdtemp(prefix="kc-load-")
    pool = service = None
    try:
        pool = make_pool(args, device, cache_dir)
        results["timing_slots"] = list(pool.devices)
        key = secrets.token_urlsafe(32)
        service = Service(pool, api_key=key, max_batch=max(DEFAULT_MAX_BATCH, args.batch),
                          max_body=max(DEFAULT_MAX_BODY, 2 * args.batch * (largest + 1024)))
        client = Client(service.url, api_key=key, timeout=4 * 3600)
        for index in range(args.batches):
            verdicts, wall = send(client, pool, draw(pairs, args.batch, index, rng), args.time_budget)
            batch = {"index": index, "n": len(verdicts), "wall_s": round(wall, 3),
                     "busy_share": corpus.busy_share(verdicts, wall, gpus),
                     "statuses": dict(Counter(v["status"] for v in verdicts)), "verdicts": verdicts}
            results["batch_results"].append(batch)
            results["summary"] = summarize(results["batch_results"], gpus)
            corpus.save(out, results)
            print(f"batch {index + 1}/{args.batches}: {batch['n']} in {wall:.1f} s, busy {batch['busy_share']}, "
                  f"{batch['statuses']}", flush=True)
        results["stats"] = client.stats()
        corpus.save(out, results)
    except ServiceError as e:  # the run's own setup (body size, batch cap, key) is wrong: the batches so far are kept
        raise SystemExit(f"reward_load: the service refused a request: {e}") from None
    finally:
        if service:
            service.close()
        if pool:
            pool.close(cancel=True)
        if args.cluster and "ray" in sys.modules:  # the local Ray this run started, or its connection
            sys.modules["ray"].shutdown()
        shutil.rmtree(cache_dir, ignore_errors=True)
    if args.markdown:
        print(markdown(results))
    return 0


def markdown(results: dict) -> str:
    s = results["summary"]

    def pair(d: dict) -> str:
        return f"{d['p50']:.1f} · {d['p95']:.1f}"

    statuses = ", ".join(f"{k} {v}" for k, v in sorted(s["statuses"].items()))
    return "\n".join([
        "| batches | batch size | verdict latency s p50 · p95 | batch latency s p50 · p95 | judge wall s p50 · p95 | "
        "cand/min | cand/GPU-min | GPU busy share | statuses |", "|--:|--:|--:|--:|--:|--:|--:|--:|---|",
        f"| {s['batches']} | {results['batch']} | {pair(s['verdict_latency_s'])} | {pair(s['batch_latency_s'])} | "
        f"{pair(s['judge_wall_s'])} | {s['per_min']} | {s['per_gpu_min']} | {s['busy_share']} | {statuses} |"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pack", required=True, help="a pack of benchmarks/corpus_throughput.py")
    ap.add_argument("--batch", type=int, default=128, help="candidates per batch (prompts x completions)")
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda if available")
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--per-gpu", type=int, default=None, help="timing slots per GPU (default: the pool's)")
    ap.add_argument("--cluster", default=None, help="ray (a local Ray) or a Ray address (auto, ray://head:10001)")
    ap.add_argument("--time-budget", type=float, default=None, help="seconds of paired timing per candidate")
    ap.add_argument("--out", default="reward_load.json")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    for flag, value in (("--batch", args.batch), ("--batches", args.batches), ("--gpus", args.gpus),
                        ("--per-gpu", args.per_gpu or 1)):
        if value < 1:
            raise SystemExit(f"reward_load: {flag} must be at least 1, not {value}")
    if args.time_budget is not None and not 0 < args.time_budget <= 600:
        raise SystemExit(f"reward_load: --time-budget takes seconds in (0, 600], not {args.time_budget}")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
