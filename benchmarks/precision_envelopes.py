"""How far a task's reference is from float64, and why: its own fp32 error (cuDNN's TF32 on and off), the TF32 and
bf16 envelopes the precision rule uses, random ops in its forward, and optionally torch.compile's error.

Usage:
    python3 benchmarks/precision_envelopes.py .data/kernelbench/level3/20_MobileNetV2.py ... [--compile] [--json F]
    python3 benchmarks/precision_envelopes.py tests/fixtures/tasks/gpu_deep_bn_cnn.py --device cpu

One input per task (weights seeded as KernelBench does, the module in its default mode, `torch.no_grad`); every
error is relative to the float64 output's RMS. On a CPU there is no TF32 ("TF32 on" and "off" are the same fp32
run); the envelopes are float64 computations (`judge/correctness/fp64.py`) and read the same on any machine. Why these numbers:
BENCHMARKS.md, 2026-11-28 · b9c8bfc (a reference 4-7% from float64 through TF32 alone is calibrated by its envelope,
with the bound between the TF32 and bf16 envelopes).
"""
from __future__ import annotations

import argparse
import copy
import json
import time
import types

import torch

from kernelcraft.judge.correctness import fp64
from kernelcraft.task import load_task


def _relative(a: torch.Tensor, t: torch.Tensor) -> dict:
    a, t = a.double(), t.double()
    s = float(t.pow(2).mean().sqrt())
    d = a - t
    return {"rms": float(d.pow(2).mean().sqrt()) / s, "max": float(d.abs().max()) / s}


def _first(out) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else next(o for o in out if isinstance(o, torch.Tensor))


def measure(path: str, device: torch.device, compile_too: bool) -> dict:
    """The errors of one task's reference (module docstring)."""
    t0 = time.perf_counter()
    task = load_task(path)
    mod = types.ModuleType("precision_envelopes_task")
    exec(compile(task.source, task.name, "exec"), mod.__dict__)  # noqa: S102 - the user's own task file
    torch.manual_seed(42)
    model = mod.Model(*mod.get_init_inputs()).to(device)
    torch.manual_seed(7)
    xs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in mod.get_inputs()]
    x64 = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in xs]
    watch = fp64._watcher()
    truth = _first(fp64._call64(model, x64, device, watch))
    row = {"task": task.name, "device": str(device), "random_ops": watch.random if watch else None,
           "convolutions": watch.convolutions if watch else None}
    old = torch.backends.cudnn.allow_tf32
    with torch.no_grad():
        try:
            for name, tf32 in (("ref_tf32_on", True), ("ref_tf32_off", False)):
                torch.backends.cudnn.allow_tf32 = tf32
                row[name] = _relative(_first(model(*xs)), truth)
        finally:
            torch.backends.cudnn.allow_tf32 = old
        for name, bits in (("envelope_tf32", fp64.TF32_BITS), ("envelope_bf16", fp64.BF16_BITS)):
            row[name] = _relative(_first(fp64._call64(model, x64, device, fp64._rounded_convolutions(bits))), truth)
        if compile_too:
            compiled = torch.compile(copy.deepcopy(model))
            compiled(*xs)
            row["compiled"] = _relative(_first(compiled(*xs)), truth)
    row["bf16_over_tf32"] = row["envelope_bf16"]["rms"] / max(row["envelope_tf32"]["rms"], 1e-300)
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tasks", nargs="+", help="task files or built-in names")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--compile", action="store_true", help="also torch.compile's output (default mode)")
    ap.add_argument("--json", help="write the rows here as JSON lines")
    args = ap.parse_args()
    rows = []
    for path in args.tasks:
        try:
            rows.append(measure(path, torch.device(args.device), args.compile))
        except Exception as e:  # noqa: BLE001 - one task's failure is a row, not the end of the run
            rows.append({"task": path, "error": f"{type(e).__name__}: {e}"[:500]})
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    print("| task | ref TF32 on | ref TF32 off | TF32 envelope | bf16 envelope | bf16/TF32 | compiled | random ops |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['task']} | error: {r['error'][:80]} |||||||")
            continue
        c = f"{r['compiled']['rms']:.3g}" if "compiled" in r else "—"
        print(f"| {r['task']} | {r['ref_tf32_on']['rms']:.3g} | {r['ref_tf32_off']['rms']:.3g} | "
              f"{r['envelope_tf32']['rms']:.3g} | {r['envelope_bf16']['rms']:.3g} | {r['bf16_over_tf32']:.2f} | {c} | "
              f"{r['random_ops']} |")


if __name__ == "__main__":
    main()
