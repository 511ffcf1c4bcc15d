"""The H100 tables behind `kernelcraft tune`'s numbers: every valid configuration of a tunable template
measured once per shape, plus the eager and `torch.compile` baselines, written as JSON lines.

  python benchmarks/tune_gpu.py tasks                  # (CPU) match the shapes, write benchmarks/tune_tasks.json
  python3 benchmarks/tune_gpu.py table --out DIR       # (GPU) compile + measure every configuration
  python3 benchmarks/tune_gpu.py baselines --out DIR   # (GPU) torch.compile max-autotune per shape; judge the best

Design decisions
- One measurement per configuration (`TritonBackend.measure`: correctness against the reference,
  then the judge's paired timing with a few rounds) and no agent on the GPU: every agent, the random
  search and the cost model are then compared offline (`benchmarks/tune_sim.py`) on the same measured
  table, at equal budgets. Exhaustive autotuning is the table's own best.
- Compiles run in a pool of processes (`features.config_features` through the JIT's warmup: the
  compiled-kernel features come back, and the binaries land in Triton's cache), overlapping the
  measurements in the main process, shape after shape. Configurations whose code and argument
  specialisation coincide across shapes are compiled once.
- Resumable and bounded: `--done DIR` skips shapes already in DIR/table.jsonl (copy a previous
  run's output there), `--time-limit` stops before a shape that would not finish.
- The shapes are KernelBench-format tasks from the built-in suite (GPU tier) and KernelBench
  (MIT licence; Ouyang, Guo, Mirhoseini, Stanford Scaling Intelligence Lab), embedded with their
  matches in `tune_tasks.json` so the device needs neither the dataset nor the analysis subprocess.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TASKS_FILE = Path(__file__).with_name("tune_tasks.json")
KB = Path(os.environ.get("KERNELCRAFT_DATASETS", "datasets")) / "kernelbench"  # KernelBench files named in SHAPES
SHAPES = [  # (name, suite task or KernelBench file); GEMM and row shapes interleaved: a cut-off run keeps both
    ("suite/matmul_square", "gpu/level1/matmul_square"),
    ("suite/softmax", "gpu/level1/softmax"),
    ("suite/gemm_bias_relu", "gpu/level2/gemm_bias_relu"),
    ("suite/layernorm", "gpu/level1/layernorm"),
    ("suite/linear_gelu_scale", "gpu/level2/linear_gelu_scale"),
    ("suite/rmsnorm", "gpu/level1/rmsnorm"),
    ("suite/linear_swish_scale", "gpu/level2/linear_swish_scale"),
    ("suite/log_softmax", "gpu/level1/log_softmax"),
    ("kb/76_Gemm_Add_ReLU", "level2/76_Gemm_Add_ReLU.py"),
    ("kb/23_Softmax", "level1/23_Softmax.py"),
    ("suite/matmul_rectangular", "gpu/level1/matmul_rectangular"),
    ("suite/l2_normalize", "gpu/level1/l2_normalize"),
    ("kb/59_Matmul_Swish_Scaling", "level2/59_Matmul_Swish_Scaling.py"),
    ("kb/38_L1Norm", "level1/38_L1Norm_.py"),
    ("suite/matmul_tall_skinny", "gpu/level1/matmul_tall_skinny"),
    ("suite/matmul_fp16", "gpu/level1/matmul_fp16"),
]


def write_tasks() -> None:
    from kernelcraft.search.recipes import rewrite
    from kernelcraft.task import load_task

    out = []
    for name, ref in SHAPES:
        source = load_task(ref).source if ref.startswith("gpu/") else (KB / ref).read_text()
        a = rewrite.analyze(source)
        if not a.tunable:
            raise SystemExit(f"{name}: no tunable match ({a.error})")
        out.append({"name": name, "ref": ref, "source": source, "match": a.tunable[0]})
        print(name, a.tunable[0]["kernel"]["kind"], a.tunable[0]["shape"])
    TASKS_FILE.write_text(json.dumps(out, indent=1) + "\n")


# ---- the compile pool ------------------------------------------------------------------------------

_MODULES: dict = {}


def _compile_one(kernel_json: dict, shape: dict, config: dict) -> dict:
    from kernelcraft.search.recipes import tunable
    from kernelcraft.tune import features

    kernel = tunable.Kernel.from_json(kernel_json)
    if kernel.key() not in _MODULES:
        _MODULES[kernel.key()] = features.load_module(kernel, Path("/tmp") / f"kc-tune-pool-{os.getpid()}")
    t0 = time.perf_counter()
    f = features.config_features(_MODULES[kernel.key()], kernel, shape, config)
    f["compile_s"] = round(time.perf_counter() - t0, 3)
    return f


def _spec_key(kernel, shape: dict, config: dict) -> str:
    """What makes two compiles identical: code, constexprs, and the JIT's int specialisation."""
    from kernelcraft.search.recipes import tunable

    if kernel.kind == "rownorm":
        sizes = (shape["cols"],)
    else:
        sizes = tuple((v % 16 == 0, v == 1, v % config["BLOCK_K"] == 0) for v in (shape["M"], shape["N"], shape["K"]))
    return f"{kernel.key()}|{sizes}|{tunable.config_key(config)}"


def table(args) -> None:
    import torch

    from kernelcraft.search.recipes import tunable
    from kernelcraft.tune.measure import TritonBackend

    t_start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tasks = json.loads(TASKS_FILE.read_text())
    if args.only:
        tasks = [t for t in tasks if any(s in t["name"] for s in args.only.split(","))]
    done = set()
    if args.done and (Path(args.done) / "table.jsonl").exists():
        for line in (Path(args.done) / "table.jsonl").read_text().splitlines():
            done.add(json.loads(line)["shape"])
    tasks = [t for t in tasks if t["name"] not in done]
    log = open(out / "table.log", "a")

    def say(msg):
        line = f"[{time.monotonic() - t_start:7.1f}s] {msg}"
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    say(f"gpu {gpu} torch {torch.__version__} shapes {[t['name'] for t in tasks]}")
    import multiprocessing as mp

    pool = ProcessPoolExecutor(max_workers=args.workers, mp_context=mp.get_context("spawn"))
    futures, plan = {}, []
    for t in tasks:
        match = tunable.Match.from_json(t["match"])
        configs = tunable.all_configs(match.kernel, match.shape)[: args.limit or None]
        keys = []
        for cfg in configs:
            k = _spec_key(match.kernel, match.shape, cfg)
            if k not in futures:
                futures[k] = pool.submit(_compile_one, match.kernel.to_json(), match.shape, cfg)
            keys.append(k)
        plan.append((t, match, configs, keys))
    say(f"{len(futures)} compiles submitted to {args.workers} workers")
    table_f = open(out / "table.jsonl", "a")
    for t, match, configs, keys in plan:
        if args.time_limit and time.monotonic() - t_start > args.time_limit:
            say(f"time limit: stopping before {t['name']}")
            break
        t0 = time.monotonic()
        backend = TritonBackend(t["source"], match, rounds=args.rounds, workdir=f"/tmp/kc-tune-main/{t['name']}")
        rows, n_ok, measure_s = [], 0, 0.0
        for cfg, k in zip(configs, keys):
            feats = futures[k].result()
            if not feats.get("ok"):
                m = {"ok": False, "reason": "compile_error", "error": feats.get("error", "")}
            else:
                t_m = time.monotonic()
                m = backend.measure(cfg).to_json()
                measure_s += time.monotonic() - t_m
            n_ok += bool(m.get("ok"))
            rows.append({"shape": t["name"], "kernel": match.kernel.to_json(), "size": match.shape, "config": cfg,
                         "features": feats, **m})
            if len(rows) == 20 and measure_s / 20 > args.abort_slow:
                say(f"{t['name']}: {measure_s / 20:.2f} s per measurement: measurements are "
                    "compiling (Triton cache misses?); aborting")
                pool.shutdown(cancel_futures=True)
                raise SystemExit(3)
            if args.time_limit and time.monotonic() - t_start > args.time_limit + 60:
                say(f"hard time limit inside {t['name']}: dropping it")
                rows = None
                break
        backend.close()
        if rows is None:
            break
        for r in rows:
            table_f.write(json.dumps(r) + "\n")
        table_f.flush()
        good = [r for r in rows if r.get("ok")]
        best = max(good, key=lambda r: r["speedup"]) if good else None
        ref = statistics.median(r["ref_ms"] for r in good) if good else None
        say(f"{t['name']}: {n_ok}/{len(rows)} ok in {time.monotonic() - t0:.1f}s ({measure_s:.1f}s measuring); "
            f"eager {ref and round(ref, 4)} ms; "
            f"best {best and round(best['ms'], 4)} ms ({best and round(best['speedup'], 3)}x) {best and best['config']}")
        del backend
        torch.cuda.empty_cache()
    pool.shutdown(cancel_futures=True)
    say("done")


def baselines(args) -> None:
    """torch.compile(max-autotune-no-cudagraphs) vs eager, paired, per shape; the best tuned config judged."""
    import torch

    from kernelcraft.evaluate import evaluate
    from kernelcraft.search.recipes import tunable, tunetemplates
    from kernelcraft.tune.measure import TritonBackend, paired_time

    t_start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tasks = {t["name"]: t for t in json.loads(TASKS_FILE.read_text())}
    rows = [json.loads(line) for line in (Path(args.done) / "table.jsonl").read_text().splitlines()]
    best = {}
    for r in rows:
        if r.get("ok") and (r["shape"] not in best or r["speedup"] > best[r["shape"]]["speedup"]):
            best[r["shape"]] = r
    names = [n for n in tasks if n in best and (not args.only or any(s in n for s in args.only.split(",")))]
    res_f = open(out / "baselines.jsonl", "a")
    for name in names:
        if args.time_limit and time.monotonic() - t_start > args.time_limit:
            print(f"time limit: stopping before {name}", flush=True)
            break
        t, r = tasks[name], best[name]
        match = tunable.Match.from_json(t["match"])
        rec = {"shape": name, "best_config": r["config"]}
        if "compile" in args.what:
            b = TritonBackend(t["source"], match, rounds=3, workdir=f"/tmp/kc-tune-base/{name}")
            t0 = time.monotonic()
            try:
                comp = torch.compile(b.ref, mode="max-autotune-no-cudagraphs", dynamic=False)
                with torch.no_grad():
                    comp(*b.inputs[0])
                    comp(*b.inputs[1])
                compile_s = time.monotonic() - t0

                def spot(x, y):
                    c = b._compare(x, y)
                    if not c.ok:
                        raise AssertionError(c.message)
                with torch.no_grad():
                    tm = paired_time(lambda a: b.ref(*a), lambda a: comp(*a), b.inputs, spot, rounds=10, device=b.dev)
                    b.runner._KC_CONFIG = dict(r["config"])
                    tt = paired_time(lambda a: b.ref(*a), lambda a: b.cand(*a), b.inputs, spot, rounds=10,
                                     device=b.dev)
                rec.update(eager_ms=tm["ref_ms"], compile_ms=tm["cand_ms"], compile_speedup=tm["speedup"],
                           compile_s=round(compile_s, 1), tuned_ms=tt["cand_ms"], tuned_speedup=tt["speedup"],
                           tuned_vs_compile=tt["speedup"] / tm["speedup"])
            except Exception as e:  # noqa: BLE001 - a baseline that fails is reported, not fatal
                rec["compile_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            b.close()
            del b
            torch._dynamo.reset()
            torch.cuda.empty_cache()
        if "judge" in args.what:
            src = tunetemplates.candidate_source(t["source"], match, r["config"], note="H100 table best")
            v = evaluate(t["source"], src, device="cuda", time_budget_s=1.0)
            rec.update(judge_status=v.status, judge_speedup=v.speedup, judge_ci95=v.timing.ci95 if v.timing else None,
                       judge_message=v.message[:300])
        res_f.write(json.dumps(rec) + "\n")
        res_f.flush()
        print(f"[{time.monotonic() - t_start:6.1f}s] {json.dumps(rec)}", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["tasks", "table", "baselines"])
    ap.add_argument("--out", default="tune_out")
    ap.add_argument("--done", default=None, help="a directory holding an earlier table.jsonl")
    ap.add_argument("--only", default="", help="comma-separated substrings of shape names")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--limit", type=int, default=0, help="at most this many configurations per shape (smoke runs)")
    ap.add_argument("--time-limit", type=float, default=0.0)
    ap.add_argument("--abort-slow", type=float, default=1.5, help="abort when the first 20 configurations of a "
                    "shape take longer than this each (compiling in the main process instead of the pool)")
    ap.add_argument("--baselines", dest="baseline_what", default="compile,judge")
    args = ap.parse_args(argv)
    if args.what == "tasks":
        write_tasks()
    elif args.what == "table":
        table(args)
    else:
        args.what = args.baseline_what.split(",")
        baselines(args)


if __name__ == "__main__":
    main()
