"""The training pipeline on one GPU with the reward service beside it: throughput numbers for BENCHMARKS.md.

Usage: python3 benchmarks/train_gpu.py [--preset 0.5b] [--device cuda] [--grpo-steps 8] [--grpo-wall 120]
                                       [--out DIR] [--tasks relu,gelu,softmax]

What runs (everything through kernelcraft.train, as `kernelcraft train run` runs it):
1. `kernelcraft serve` in a subprocess on the same device (its own pool of worker processes).
2. A pairs file of the tasks with a known-correct candidate each, judged by `bench` (its verdicts decide
   what enters the data), and a random-weight model from the preset (`0.5b`: Qwen2 architecture, ~0.49B
   parameters, tokenizer trained offline) — nothing is downloaded.
3. SFT until the model reproduces its answers, one self-training round, then GRPO steps rewarded by the
   service (prompts without exemplars: a random-init model memorises its answers for the data's prompts).
Measured: GRPO steps/s and step time, generation tokens/s (completion tokens over the time from step start
to the reward call), reward latency p50/p95 (one service batch per step), evaluations/min, peak GPU memory
(torch's peak in the trainer; nvidia-smi's device total, service workers included), each stage's wall time.
Writes results.json and results.md to --out (default $OUT, else runs/train-gpu) and prints the table.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ANSWERS = {"relu": "x.clamp_min(0.0)", "gelu": "torch.nn.functional.gelu(x)", "softmax": "torch.softmax(x, dim=-1)"}
KEY = "kc-train-gpu-benchmark"


def cand(expr: str) -> str:
    return f"import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return {expr}\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_service(device: str, work: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    code = (f"from kernelcraft.serve.service import serve; serve(port={port}, devices={device!r}, "
            f"cache_dir={str(work / 'kc-cache')!r}, log_level='warning')")
    log = open(work / "serve.log", "wb")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, KERNELCRAFT_API_KEY=KEY))
    from kernelcraft.client import Client

    client, deadline = Client(f"http://127.0.0.1:{port}", KEY), time.monotonic() + 180
    while True:
        try:
            client.health()
            return proc, client.url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("service did not start:\n" + (work / "serve.log").read_text()[-3000:])
            time.sleep(0.5)


class GpuMemory:
    """Peak device memory in use (nvidia-smi), sampled every second: trainer and service workers together."""

    def __init__(self):
        self.peak_mib, self._stop = 0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=10).stdout
                self.peak_mib = max(self.peak_mib, max(int(x) for x in out.split()))
            except (OSError, ValueError, subprocess.SubprocessError):
                return
            self._stop.wait(1.0)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()


def save(out: Path, res: dict) -> None:
    """results.json after every stage: a run cut off by its time limit still reports what it measured."""
    (out / "results.json").write_text(json.dumps(res, indent=2, default=str) + "\n")


def versions() -> dict:
    import importlib.metadata as md

    import torch

    v = {p: md.version(p) for p in ("trl", "transformers", "peft", "datasets", "accelerate", "tokenizers")
         if _has(p, md)}
    v.update(torch=torch.__version__, cuda=torch.version.cuda,
             gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, python=sys.version.split()[0])
    return v


def _has(p, md) -> bool:
    try:
        md.version(p)
        return True
    except md.PackageNotFoundError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="0.5b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tasks", default="relu,gelu,softmax")
    ap.add_argument("--sft-steps", type=int, default=200)
    ap.add_argument("--sft-lr", type=float, default=3e-4)
    ap.add_argument("--grpo-steps", type=int, default=8)
    ap.add_argument("--grpo-wall", type=float, default=120.0, help="GRPO stops after this many seconds")
    ap.add_argument("--prompts-per-step", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-completion", type=int, default=256)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", default=os.environ.get("OUT") or "runs/train-gpu")
    args = ap.parse_args()

    import torch

    from kernelcraft.bench.options import BenchOptions
    from kernelcraft.bench.run import run as run_bench
    from kernelcraft.bench.sources import resolve
    from kernelcraft.client import Client
    from kernelcraft.protocol import Protocol
    from kernelcraft.task import load_task
    from kernelcraft.train.config import parse_config
    from kernelcraft.train.metrics import read_metrics
    from kernelcraft.train.models import build_random_model, load_model, parameter_count
    from kernelcraft.train.pipeline import run_data, run_grpo_stage, run_selftrain_stage, run_sft_stage
    from kernelcraft.train.prompting import device_from_verdict

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/kc-train-gpu" if args.device.startswith("cuda") else out / "work")
    work.mkdir(parents=True, exist_ok=True)
    res: dict = {"command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]), "date": time.strftime("%Y-%m-%d"),
                 "versions": versions(), "stages_s": {}}
    print(json.dumps(res["versions"]), flush=True)
    tier = "gpu" if args.device.startswith("cuda") else "tiny"
    fast = {"trials": 3, "time_budget_s": 0.5, "min_rounds": 5}
    t0 = time.monotonic()
    proc, url = start_service("cuda" if tier == "gpu" else "cpu", work)
    res["stages_s"]["service_start"] = round(time.monotonic() - t0, 1)
    try:
        names = [n for n in args.tasks.split(",") if n]
        rows = [{"level_id": 1, "task_id": i, "ref_code": load_task(f"{tier}/level1/{n}").source,
                 "custom_code": cand(ANSWERS[n])} for i, n in enumerate(names, 1)]
        (work / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        t = time.monotonic()
        run_bench(resolve(str(work / "pairs.jsonl")), work / "bench",
                  BenchOptions(device=args.device, baselines="none", report=False, protocol=Protocol.make(**fast)))
        res["stages_s"]["bench_pairs"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        model_dir = build_random_model(work / "model", args.preset)
        res["stages_s"]["build_model"] = round(time.monotonic() - t, 1)
        res["parameters"] = parameter_count(load_model(model_dir))
        print(f"model: {res['parameters'] / 1e9:.3f}B parameters, built in {res['stages_s']['build_model']} s", flush=True)
        verdict = json.loads((work / "bench" / "verdicts.jsonl").read_text().splitlines()[0])
        cfg = parse_config({
            "out": str(work / "run"), "device": "cpu" if tier == "tiny" else None,
            "model": {"path": str(model_dir), "dtype": args.dtype},
            "data": {"pairs": [{"path": str(work / "pairs.jsonl"), "verdicts": [str(work / "bench" / "verdicts.jsonl")]}],
                     "heldout_fraction": 0.0},
            "service": {"url": url, "options": {"device": "cuda" if tier == "gpu" else "cpu", **fast}},
            "prompt": {"device_description": device_from_verdict(verdict).describe()},
            "sft": {"max_steps": args.sft_steps, "learning_rate": args.sft_lr, "lr_scheduler": "constant",
                    "save_steps": 10_000, "logging_steps": 10, "max_length": 4096},
            "selftrain": {"rounds": 1, "samples_per_task": 2, "temperature": 0.0, "max_new_tokens": args.max_completion,
                          "sft": {"epochs": 1, "learning_rate": 1e-5, "save_steps": 10_000, "logging_steps": 1}},
            "grpo": {"steps": args.grpo_steps, "prompts_per_step": args.prompts_per_step, "group_size": args.group_size,
                     "max_completion_length": args.max_completion, "temperature": 1.0, "learning_rate": 1e-6,
                     "save_steps": 10_000, "exemplars": 0},
            "budget": {"wall_s": args.grpo_wall},
        })
        os.environ["KERNELCRAFT_API_KEY"] = KEY
        client = Client(url, KEY)
        save(out, res)
        for name, fn in (("data", lambda: run_data(cfg)), ("sft", lambda: run_sft_stage(cfg)),
                         ("selftrain", lambda: run_selftrain_stage(cfg, client=client))):
            t = time.monotonic()
            fn()
            res["stages_s"][name] = round(time.monotonic() - t, 1)
            print(f"stage {name}: {res['stages_s'][name]} s", flush=True)
            save(out, res)
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        t = time.monotonic()
        with GpuMemory() as mem:
            run_grpo_stage(cfg, client=client)
        res["stages_s"]["grpo"] = round(time.monotonic() - t, 1)
        res["gpu_memory"] = {"trainer_peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)
                             if torch.cuda.is_available() else None, "device_peak_used_gib": round(mem.peak_mib / 1024, 2)}
        summary = json.loads((cfg.out_dir / "grpo" / "summary.json").read_text())
        recs = read_metrics(cfg.out_dir)
        grpo = [r for r in recs if r["stage"] == "grpo" and "kernelcraft/correct_rate" in r]
        sft = [r for r in recs if r["stage"] == "sft" and "loss" in r]
        rnd = [r for r in recs if r["stage"] == "selftrain_round"]

        def mean(key):
            vals = [r[key] for r in grpo if key in r]
            return round(sum(vals) / len(vals), 3) if vals else None

        res["grpo"] = {"steps": summary["steps"], "wall_s": round(summary["train_wall_s"], 1),
                       "steps_per_s": round(summary["steps"] / summary["train_wall_s"], 4),
                       "step_time_s": mean("step_time"), "gen_tokens_per_s": mean("kernelcraft/gen_tokens_per_s"),
                       "completion_mean_tokens": mean("completions/mean_length"),
                       "reward_latency_p50_s": summary["reward_latency_p50_s"],
                       "reward_latency_p95_s": summary["reward_latency_p95_s"],
                       "evaluations": summary["evaluations"],
                       "evaluations_per_min": round(summary["evaluations"] / (summary["train_wall_s"] / 60), 2),
                       "correct_rate": mean("kernelcraft/correct_rate"), "kl": mean("kl"),
                       "completions_per_step": args.prompts_per_step * args.group_size}
        res["sft"] = {"steps": args.sft_steps, "first_loss": sft[0]["loss"] if sft else None,
                      "last_loss": sft[-1]["loss"] if sft else None}
        res["selftrain"] = rnd[0] if rnd else None
        res["service"] = Client(url, KEY).stats().get("service")
    except BaseException as e:
        res["error"] = f"{type(e).__name__}: {e}"
        save(out, res)
        raise
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    save(out, res)
    g, m = res["grpo"], res["gpu_memory"]
    table = "\n".join([
        f"| {res['versions'].get('gpu') or 'CPU'} · torch {res['versions']['torch']} · trl {res['versions'].get('trl')} "
        f"· {res['parameters'] / 1e9:.3f}B params ({args.dtype}) | value |", "|---|---|",
        f"| GRPO steps (x {g['completions_per_step']} completions) / wall | {g['steps']} / {g['wall_s']} s |",
        f"| steps/s · mean step time | {g['steps_per_s']} · {g['step_time_s']} s |",
        f"| generation tokens/s (mean completion {g['completion_mean_tokens']} tokens) | {g['gen_tokens_per_s']} |",
        f"| reward latency p50 / p95 (one service batch per step) | {g['reward_latency_p50_s']} / "
        f"{g['reward_latency_p95_s']} s |",
        f"| evaluations · evaluations/min | {g['evaluations']} · {g['evaluations_per_min']} |",
        f"| correctness rate · KL (mean over steps) | {g['correct_rate']} · {g['kl']} |",
        f"| GPU memory: trainer peak allocated · device peak used | {m['trainer_peak_allocated_gib']} GiB · "
        f"{m['device_peak_used_gib']} GiB |",
        f"| SFT loss first → last ({res['sft']['steps']} steps) | {res['sft']['first_loss']} → {res['sft']['last_loss']} |",
        f"| self-training round: correct rate · kept | {(res['selftrain'] or {}).get('correct_rate')} · "
        f"{(res['selftrain'] or {}).get('kept')} |",
        "| stage wall times (s) | " + ", ".join(f"{k} {v}" for k, v in res["stages_s"].items()) + " |"])
    (out / "results.md").write_text(table + "\n")
    print(table, flush=True)


if __name__ == "__main__":
    main()
