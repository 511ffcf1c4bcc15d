"""One-sided jobs of the judge process: the degenerate-task probe and the build-only prebuild.

`probe` runs only the task's reference (trusted code), in the judge process; `build_only` imports the candidate in
the candidate's side process, never in the judge, at a lower CPU priority (`BUILD_NICE`), so its builds land in
the cache.

Rationale: docs/design/judge-caller.md#single
"""
from __future__ import annotations

import torch

from kernelcraft.judge.reject import Reject
from kernelcraft.judge.process.side import import_file

BUILD_NICE = 10  # added niceness of a prebuild (nvcc and its children inherit it)


class Single:
    def __init__(self, job: dict, chan, sides: dict):
        self.job, self.chan, self.sides = job, chan, sides
        self.phase = "start"
        self.build_s = 0.0
        self.result: dict = {"guards": []}
        self.device = torch.device("cuda:0" if job["device"].startswith("cuda") else "cpu")

    def enter(self, phase: str) -> None:
        self.phase = phase
        self.chan.send("phase", phase=phase, build_s=self.build_s)

    def build_only(self) -> dict:
        self.enter("import")
        try:
            got = self.sides["candidate"].request(dict(
                cmd="import", path=self.job["candidate_path"], device="cpu", cache_dir=self.job["cache_dir"],
                arch=self.job.get("arch"), strict=False, guarded=False, nice=BUILD_NICE), phase="import")
        except Reject as r:
            if "build_failed" in r.reasons or r.status == "timeout":
                raise
            self.result["import_error"] = r.message
            return self.result
        self.build_s = float(got.get("build_s", 0.0))
        self.result["build_cache"] = got.get("build_cache", {"builds": 0, "hits": 0})
        return self.result

    def probe(self) -> dict:
        """Is the task degenerate? Run only the reference: constant, near-zero, or input/weight-blind output."""
        self.enter("reference")
        ref_mod = import_file(self.job["task_path"], "kernelcraft_reference")
        self.enter("probe")
        seed = self.job["protocol"]["seed"]
        device = self.device

        def run(weight_seed, input_seed):
            torch.manual_seed(weight_seed)
            model = ref_mod.Model(*ref_mod.get_init_inputs()).to(device)
            torch.manual_seed(input_seed)
            with torch.device(device):
                inputs = ref_mod.get_inputs()
            inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
            with torch.no_grad():
                out = model(*inputs)
            outs = [o.detach().double().cpu().flatten() for o in ([out] if isinstance(out, torch.Tensor) else out)
                    if isinstance(o, torch.Tensor)]
            return model, torch.cat(outs) if outs else torch.zeros(0)

        model, a = run(seed, seed + 1)
        _, b = run(seed, seed + 2)
        _, c = run(seed + 3, seed + 1)
        problems = []
        finite = a[torch.isfinite(a)]
        if a.numel() == 0:
            problems.append("the reference returns no tensor")
        elif finite.numel() < a.numel():
            problems.append(f"{a.numel() - finite.numel()} of {a.numel()} outputs are NaN/Inf")
        if finite.numel():
            scale = float(finite.abs().max())
            spread = float(finite.std()) if finite.numel() > 1 else 0.0
            if scale < 1e-6:
                problems.append(f"output is near zero (max |y| = {scale:.2g})")
            elif spread <= 1e-7 * scale:
                problems.append("output is constant")
            if a.shape == b.shape and torch.allclose(a, b, rtol=1e-6, atol=1e-9 * max(scale, 1.0), equal_nan=True):
                problems.append("output does not depend on the inputs")
            if any(p.numel() for p in model.parameters()) and a.shape == c.shape and torch.allclose(
                    a, c, rtol=1e-6, atol=1e-9 * max(scale, 1.0), equal_nan=True):
                problems.append("output does not depend on the weights")
        return {"problems": problems, "output_elements": int(a.numel()),
                "output_std": float(finite.std()) if finite.numel() > 1 else 0.0,
                "output_max_abs": float(finite.abs().max()) if finite.numel() else 0.0}
