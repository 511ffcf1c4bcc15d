"""Scans as a row template on a CPU: which forwards are scans (cumsum, cumprod; reversed, exclusive, masked),
which are not, and the rendered kernels' outputs in Triton's interpreter against PyTorch's."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kernelcraft.search.recipes import tunable, tunetemplates
from kernelcraft.task import load_task

sys.path.insert(0, str(Path(__file__).resolve().parent))
import template_match  # noqa: E402
import triton_interpreter  # noqa: E402
from conftest import FIXTURES  # noqa: E402

TASKS = FIXTURES / "tasks"
SCANS = [  # (task, op, reverse, exclusive, masked)
    ("tiny/level1/cumsum", "cumsum", False, False, False),
    (str(TASKS / "scan_cumsum_reverse.py"), "cumsum", True, False, False),
    (str(TASKS / "scan_cumsum_exclusive.py"), "cumsum", False, True, False),
    (str(TASKS / "scan_cumsum_masked.py"), "cumsum", False, False, True),
    (str(TASKS / "scan_cumprod.py"), "cumprod", False, False, False),
]
NOT_SCANS = [  # (forward's parameters, its return expression, get_inputs' list): each near a scan, none one
    ("x", "torch.cumsum(x, dim=0)", "[torch.rand(6, 100)]"),  # not the last dimension
    ("x", "torch.cumsum(x, dim=1, dtype=torch.float64)", "[torch.rand(6, 100)]"),  # a dtype change
    ("x", "torch.cumsum(x, dim=1) * 2", "[torch.rand(6, 100)]"),  # more than the scan
    ("x", "torch.cumsum(x.flip(0), dim=1).flip(0)", "[torch.rand(6, 100)]"),  # flipped along another dimension
    ("x", "torch.cumsum(x.flip(1), dim=1)", "[torch.rand(6, 100)]"),  # flipped in, not out
    ("x, m", "torch.cumsum(x * m, dim=1)", "[torch.rand(6, 100), torch.rand(100) > 0.5]"),  # a broadcast mask
    ("x, m", "torch.cumsum(x + m, dim=1)", "[torch.rand(6, 100), torch.rand(6, 100)]"),  # not a mask
    ("x", "torch.cat((torch.ones_like(x[:, :1]), torch.cumsum(x[:, :-1], dim=1)), dim=1)",
     "[torch.rand(6, 100)]"),  # ones, not zeros, in front
    ("x", "torch.cat((torch.zeros_like(x[:, :1]), torch.cumsum(x[:, 1:], dim=1)), dim=1)",
     "[torch.rand(6, 100)]"),  # the scan of a later slice
    ("x", "F.pad(torch.cumsum(x[:, :-1], dim=1), (0, 1))", "[torch.rand(6, 100)]"),  # the zero column after
    ("x", "F.pad(torch.cumsum(x[:, :-1], dim=1), (1, 0), value=1.0)", "[torch.rand(6, 100)]"),  # not zeros
    ("x, m", "torch.cumsum(torch.where(m, x, 0.0), dim=1)",
     "[torch.rand(6, 100), torch.rand(6, 100) > 0.5]"),  # where is not x * mask (an infinite x masked out)
]
SPELLINGS = [  # (forward's parameters, its return expression, get_inputs' list, what the match says)
    ("x", "x.cumsum(-1)", "[torch.rand(6, 100)]", "row cumsum"),
    ("x", "x.cumsum(dim=2)", "[torch.rand(2, 6, 100)]", "row cumsum"),
    ("x", "torch.flip(torch.flip(x, dims=(1,)).cumsum(1), dims=[1])", "[torch.rand(6, 100)]", "row reverse cumsum"),
    ("x", "x.flip(-1).cumprod(-1).flip(-1)", "[torch.rand(6, 100)]", "row reverse cumprod"),
    ("x", "F.pad(torch.cumsum(x[:, :-1], dim=1), (1, 0))", "[torch.rand(6, 100)]", "row exclusive cumsum"),
    ("x, m", "(m * x).cumsum(1)", "[torch.rand(6, 100), torch.rand(6, 100) > 0.5]", "row masked cumsum"),
]



@pytest.mark.parametrize("task, op, reverse, exclusive, masked", SCANS)
def test_scans_are_the_row_template(task, op, reverse, exclusive, masked):
    (m,) = template_match.matches(load_task(task).source)
    k = m.kernel
    assert (k.kind, k.op, k.reverse, k.exclusive, k.masked) == ("rownorm", op, reverse, exclusive, masked)
    assert m.bindings["x"] == "x" and (m.bindings.get("mask") == "mask") == masked
    assert op in tunable.describe(m) and m.shape["cols"] in (1000, 1024)


@pytest.mark.parametrize("params, body, inputs", NOT_SCANS)
def test_near_scans_are_not_matched(params, body, inputs):
    assert template_match.matches(template_match.task_source(params, body, inputs)) == []


@pytest.mark.parametrize("params, body, inputs, says", SPELLINGS)
def test_other_spellings_of_the_scans(params, body, inputs, says):
    (m,) = template_match.matches(template_match.task_source(params, body, inputs))
    assert tunable.describe(m).startswith(says + " (")


def test_scan_flags_are_for_scans_only_and_keep_older_keys():
    with pytest.raises(tunable.TunableError, match="scans"):
        tunable.Kernel("rownorm", "float32", op="softmax", reverse=True)
    with pytest.raises(tunable.TunableError, match="scans"):
        tunable.Kernel("gemm", "float32", masked=True)
    norm = tunable.Kernel("rownorm", "float32", op="softmax")
    assert "reverse" not in json.dumps(norm.key())  # a field at its default leaves the key as it was
    keys = {tunable.Kernel("rownorm", "float32", op="cumsum", reverse=r, exclusive=e, masked=m).key()
            for r in (False, True) for e in (False, True) for m in (False, True)}
    assert len(keys) == 8


def test_rendered_scan_candidates_are_correct_in_the_interpreter(tmp_path):
    pytest.importorskip("triton")
    cases = []
    for task, *_ in SCANS:
        t = load_task(task)
        (m,) = template_match.matches(t.source)
        cfgs = tunable.all_configs(m.kernel, m.shape)
        for cfg in (cfgs[0], cfgs[-1]):  # several blocks with a ragged last one, and one block
            p = tmp_path / f"c{len(cases)}.py"
            p.write_text(tunetemplates.candidate_source(t.source, m, cfg))
            cases.append((t.source, str(p)))
    assert triton_interpreter.wrong_candidates(cases, tmp_path, timeout=300) == []


def test_every_scan_variant_in_the_interpreter(tmp_path):
    """Each op x reverse x exclusive x masked, float32 and float16, 300 columns in 256-blocks, against the
    scan written out in PyTorch (float64)."""
    pytest.importorskip("triton")
    variants = [dict(op=op, reverse=r, exclusive=e, masked=mk, dtype=dt) for op in tunable.SCAN_OPS
                for r in (False, True) for e in (False, True) for mk in (False, True) for dt in ("float32", "float16")]
    for i, v in enumerate(variants):
        k = tunable.Kernel("rownorm", v["dtype"], op=v["op"], reverse=v["reverse"], exclusive=v["exclusive"],
                           masked=v["masked"])
        (tmp_path / f"k{i}.py").write_text(tunetemplates.kernel_module(k))
    (tmp_path / "variants.json").write_text(json.dumps(variants))
    proc = triton_interpreter.run(f"""
        import importlib.util, json, torch
        bad = []
        for i, v in enumerate(json.load(open({str(tmp_path / 'variants.json')!r}))):
            spec = importlib.util.spec_from_file_location(f"k{{i}}", {str(tmp_path)!r} + f"/k{{i}}.py")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            torch.manual_seed(i)
            x = (torch.rand(3, 300) * 0.04 + 0.98).to(getattr(torch, v["dtype"]))
            mask = torch.rand(3, 300) > 0.3
            z = x.double() * mask if v["masked"] else x.double()
            if v["reverse"]:
                z = z.flip(1)
            if v["exclusive"]:
                z = torch.cat((torch.full_like(z[:, :1], 1.0 if v["op"] == "cumprod" else 0.0), z[:, :-1]), 1)
            want = getattr(torch, v["op"])(z, 1)
            want = want.flip(1) if v["reverse"] else want
            cfg = {{"BLOCK_N": 256, "num_warps": 4, "num_stages": 1}}
            got = mod._kc_run(x, (), cfg, mask if v["masked"] else None)
            tol = 2e-3 if v["dtype"] == "float16" else 1e-5
            if got.dtype != x.dtype or not torch.allclose(got.double(), want, rtol=tol, atol=tol):
                bad.append((v, float((got.double() - want).abs().max())))
        print(json.dumps(bad))
    """, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
