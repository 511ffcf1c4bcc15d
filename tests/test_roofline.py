"""The roofline of a bench task (`bench.roofline`): its minimal work counted on `meta` (a matmul's FLOPs are
2·M·N·K, an elementwise task moves its input and output once), the GPU products with known peaks, the bound and
the fractions, no roofline for an unknown GPU or a model that cannot run on `meta`, a task that hangs or kills
the counting process costing only itself, the work cached in the bench directory, and the bench summary, page
and terminal line carrying it. CPU only."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernelcraft.bench import roofline as rl
from kernelcraft.bench.metrics import summarise
from kernelcraft.bench.options import BenchOptions
from kernelcraft.bench.report import render
from kernelcraft.bench.sources import Item, Source
from kernelcraft.cli import bench as cli_bench
from kernelcraft.task import load_task

H200 = "cuda NVIDIA H200"
FAILS_ON_META = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * x.sum().item()  # a number read back from the tensor: meta has none


def get_inputs():
    return [torch.randn(8, 8)]


def get_init_inputs():
    return []
'''
HANGS = FAILS_ON_META.replace("x * x.sum().item()  # a number read back from the tensor: meta has none",
                              "__import__('time').sleep(600) or x")
KILLS = FAILS_ON_META.replace("x * x.sum().item()  # a number read back from the tensor: meta has none",
                              "__import__('os')._exit(7)")


def _shapes(name: str) -> list[tuple[int, ...]]:
    """The task's input shapes, from its own get_inputs on `meta`."""
    import torch

    ns: dict = {}
    exec(load_task(name).source, ns)
    with torch.device("meta"):
        return [tuple(t.shape) for t in ns["get_inputs"]()]


@pytest.fixture(scope="module")
def work():
    names = ["tiny/level1/matmul_square", "tiny/level1/matmul_rectangular", "tiny/level1/matmul_fp16",
             "tiny/level1/relu", "tiny/level2/gemm_bias_relu"]
    return rl.measure({n: load_task(n).source for n in names} | {"fails": FAILS_ON_META})


def test_a_matmul_counts_2mnk_flops_and_moves_its_operands_once(work):
    for name, size in (("tiny/level1/matmul_square", 4), ("tiny/level1/matmul_rectangular", 4),
                       ("tiny/level1/matmul_fp16", 2)):
        (m, k), (k2, n) = _shapes(name)
        assert k == k2
        w = work[name]
        assert w["flops"] == 2 * m * n * k, name
        assert w["flops_by_dtype"] == {"fp16" if size == 2 else "fp32": 2 * m * n * k}, name
        assert w["bytes"] == (m * k + k * n + m * n) * size and w["bytes_params"] == 0, name


def test_an_elementwise_task_moves_its_input_and_output_and_counts_no_flops(work):
    (rows, cols), = _shapes("tiny/level1/relu")
    w = work["tiny/level1/relu"]
    assert (w["flops"], w["flops_by_dtype"]) == (0, {})
    assert w["bytes_inputs"] == w["bytes_outputs"] == rows * cols * 4 and w["bytes"] == 2 * rows * cols * 4


def test_parameters_are_read_once(work):
    import torch

    ns: dict = {}
    exec(load_task("tiny/level2/gemm_bias_relu").source, ns)
    with torch.device("meta"):
        params = sum(p.numel() * p.element_size() for p in ns["Model"](*ns["get_init_inputs"]()).parameters())
    w = work["tiny/level2/gemm_bias_relu"]
    assert params > 0 and w["bytes_params"] == params
    assert w["bytes"] == w["bytes_inputs"] + params + w["bytes_outputs"] and w["flops"] > 0


def test_a_model_that_cannot_run_on_meta_has_no_roofline(work):
    w = work["fails"]
    assert w == {"error": "the forward cannot run on the meta device: RuntimeError: Tensor.item() cannot be called on "
                          "meta tensors"}
    peak = rl.peaks(H200)
    assert rl.bound(w, peak) is None and rl.task_roofline(w, peak, ref_ms=1.0) is None
    assert rl.why_not(w, peak) == w["error"]


def test_a_task_that_hangs_or_kills_the_process_costs_only_itself():
    relu = load_task("tiny/level1/relu").source
    got = rl.measure({"hangs": HANGS, "kills": KILLS, "relu": relu}, timeout_s=3)
    assert got["hangs"]["retry"] and "longer than 3 s" in got["hangs"]["error"]
    assert "exited (7)" in got["kills"]["error"] and not got["kills"].get("retry")  # the task's own doing
    assert got["relu"]["flops"] == 0 and got["relu"]["bytes"] > 0


def test_the_work_is_cached_in_the_bench_directory(tmp_path, monkeypatch):
    calls = []

    def fake(sources, **kw):
        calls.append(sorted(sources))
        return {sha: ({"error": "slow", "retry": True} if sha == "b" else
                      {"flops": 2, "flops_by_dtype": {"fp32": 2}, "bytes": 8}) for sha in sources}

    monkeypatch.setattr(rl, "measure", fake)
    first = rl.cached_work(tmp_path, {"a": "src a", "b": "src b"})
    assert first["a"]["bytes"] == 8 and first["b"]["retry"]
    again = rl.cached_work(tmp_path, {"a": "src a", "b": "src b"})
    assert calls == [["a", "b"], ["b"]]  # a resumed bench counts only what was not kept (a timeout is not)
    assert again["a"] == first["a"]
    with open(tmp_path / rl.CACHE_FILE, "a") as f:
        f.write('{"task_sha256": "c", "meth')  # a torn last line (a kill mid-write)
    assert set(rl.load(tmp_path)) == {"a"}
    rl.cached_work(tmp_path, {"d": "src d"})
    assert set(rl.load(tmp_path)) == {"a", "d"}  # the next line starts on a line of its own


@pytest.mark.parametrize("name,product", [
    ("cuda NVIDIA H200", "H200"), ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("cuda NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 SXM5 80GB", "H100 SXM"), ("NVIDIA A100-SXM4-80GB", "A100 SXM4 80GB"),
    ("NVIDIA A100-SXM4-40GB", "A100 SXM4 40GB"), ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"),
    ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"),
    ("NVIDIA H100 NVL", None), ("NVIDIA H200 NVL", None), ("NVIDIA GH200 480GB", None), ("NVIDIA A100", None),
    ("Tesla V100-SXM2-16GB", None), ("cpu AMD EPYC 7B13 x2", None), ("", None), (None, None)])
def test_device_names_map_to_products_and_unknown_ones_to_none(name, product):
    assert rl.product(name) == product
    assert (rl.peaks(name) is None) == (product is None)


def test_bound_and_fraction_arithmetic():
    peak = rl.peaks(H200)  # 4.8 TB/s; fp32 67, fp16 989.4 TFLOP/s
    assert peak["memory_tb_s"] == 4.8 and peak["tflops"]["fp32"] == 67.0 and "datasheet" in peak["source"]
    mem = {"flops": 0, "flops_by_dtype": {}, "bytes": 4.8e9}
    assert rl.bound(mem, peak) == {"bound_ms": pytest.approx(1.0), "compute_ms": 0.0,
                                   "memory_ms": pytest.approx(1.0), "bound_by": "memory"}
    mixed = {"flops": 134e9 + 989.4e9, "flops_by_dtype": {"fp32": 134e9, "fp16": 989.4e9}, "bytes": 4.8e9}
    b = rl.bound(mixed, peak)  # fp32 2 ms + fp16 1 ms of compute against 1 ms of memory
    assert b["compute_ms"] == pytest.approx(3.0) and b["bound_ms"] == pytest.approx(3.0) and b["bound_by"] == "compute"
    row = rl.task_roofline(mixed, peak, ref_ms=6.0, compile_ms=4.0, cand_ms=2.5)
    assert row["reference"] == pytest.approx(0.5) and row["compile"] == pytest.approx(0.75)
    assert row["candidate"] == pytest.approx(1.2)  # past the fp32 SIMT roof: tensor cores did some of it
    assert row["dtypes"] == ["fp16", "fp32"] and row["flops"] == mixed["flops"]
    assert rl.task_roofline(mixed, peak, ref_ms=None, cand_ms=0)["reference"] is None
    assert rl.fraction(2.0, 4.0) == 0.5 and rl.fraction(None, 4.0) is None and rl.fraction(2.0, None) is None
    ints = {"flops": 10, "flops_by_dtype": {"torch.int8": 10}, "bytes": 1}
    assert rl.bound(ints, peak) is None and rl.why_not(ints, peak) == "no peak for torch.int8 FLOPs"
    assert rl.bound(mem, None) is None and rl.bound(None, peak) is None


# ---- the bench's summary, page and terminal line ----------------------------------------------------------------

def _timed(ref_ms, cand_ms, status="correct"):
    return {"status": status, "speedup": ref_ms / cand_ms if status == "correct" else None,
            "timing": {"ref_ms": ref_ms, "cand_ms": cand_ms, "ci95": [1.1, 1.3]} if status == "correct" else None}


def _bench(devname: str, records: dict, base: dict, work: dict, baselines_only: bool = False) -> dict:
    items = []
    for i, name in enumerate(records):
        it = Item(name=name, task=load_task(name), level=int(name.split("/")[1][-1]), task_id=i + 1)
        it.key = f"k{i}"
        items.append(it)
    recs = {} if baselines_only else {it.key: {"message": "", "reasons": [], **records[it.name]} for it in items}
    shas = {it.name: it.task.sha256 for it in items}
    return summarise(Source(spec="tiny", name="tiny", kind="builtin", items=items), items, recs,
                     {(shas[n], b): r for (n, b), r in base.items()}, ["eager", "inductor"], {},
                     {"from_run": 0, "cache_hits": 0, "measured_now": 0}, Path("/nonexistent-bench"), devname,
                     BenchOptions(device="cuda", baselines="eager,inductor", baselines_only=baselines_only), {}, 0,
                     len(items), 1.0, work={shas[n]: w for n, w in work.items() if n in shas})


MATMUL, RELU, GELU = "tiny/level1/matmul_square", "tiny/level1/relu", "tiny/level1/gelu"
WORK = {MATMUL: {"flops": 67e9, "flops_by_dtype": {"fp32": 67e9}, "bytes": 4.8e8},  # 1 ms of compute
        RELU: {"flops": 0, "flops_by_dtype": {}, "bytes": 4.8e9},  # 1 ms of memory
        GELU: {"error": "the forward cannot run on the meta device: RuntimeError: ..."}}
BASE = {(MATMUL, "inductor"): {"status": "correct", "speedup": 2.0, "timing": {"ref_ms": 4.2, "cand_ms": 2.0}},
        (RELU, "inductor"): {"status": "incorrect", "speedup": None, "timing": None}}


def test_the_summary_rows_carry_the_roofline_and_the_summary_its_peaks():
    s = _bench(H200, {MATMUL: _timed(4.0, 1.25), RELU: _timed(2.0, 4.0), GELU: {"status": "incorrect"}}, BASE, WORK)
    rows = {r["item"]: r for r in s["items"]}
    m = rows[MATMUL]["roofline"]
    assert (m["bound_by"], m["bound_ms"]) == ("compute", pytest.approx(1.0))
    assert m["reference"] == pytest.approx(0.25) and m["candidate"] == pytest.approx(0.8)
    assert m["compile"] == pytest.approx(0.5)  # the compile baseline's own time, 2 ms
    r = rows[RELU]["roofline"]
    assert r["bound_by"] == "memory" and r["reference"] == pytest.approx(0.5) and r["candidate"] == pytest.approx(0.25)
    assert r["compile"] is None  # no correct compile baseline
    assert rows[GELU]["roofline"] is None
    assert (rows[MATMUL]["ref_ms"], rows[MATMUL]["cand_ms"]) == (4.0, 1.25)  # the existing keys mean what they meant
    roof = s["roofline"]
    assert roof["product"] == "H200" and roof["tasks"] == 2 and roof["bound_by"] == {"memory": 1, "compute": 1}
    assert roof["median_fraction"] == {"reference": pytest.approx(0.375), "compile": pytest.approx(0.5),
                                       "candidate": pytest.approx(0.525)}
    assert roof["without"] == {GELU: WORK[GELU]["error"]} and "SIMT" in roof["note"]
    json.dumps(s)  # what --json prints and summary.json holds

    html = render(s)
    table = html[html.index("<table id='items'>"):html.index("</table>", html.index("<table id='items'>"))]
    assert "roof: reference" in table and "roof: candidate" in table and ">80%<" in table and ">compute<" in table
    assert "id='roofline'" in html and "Roofline on the H200: 4.8 TB/s" in html and _esc(WORK[GELU]["error"]) in html

    line = cli_bench.roofline_line(s)
    assert line.startswith("roofline on the H200 (4.8 TB/s, 67 fp32 / 989.4 bf16 TFLOP/s): 2 task(s) bounded, "
                           "1 by memory, 1 by compute · median share of the roof: reference 38%, best compile 50%, "
                           "candidate 52%"), line
    assert "1 without one" in line
    assert "of the roof" in cli_bench._result_line({"what": "item", "status": "correct", "speedup": 3.2,
                                                    "outcome": "faster", "ci95": [1.1, 1.3], "roofline": 0.0042})
    assert "0.42% of the roof" in cli_bench._result_line({"what": "item", "status": "correct", "speedup": 3.2,
                                                          "outcome": "faster", "roofline": 0.0042})


def _esc(text: str) -> str:
    import html

    return html.escape(text)


def test_a_baselines_only_bench_takes_the_reference_time_from_its_baselines():
    s = _bench(H200, {MATMUL: {}, RELU: {}}, BASE, WORK, baselines_only=True)
    m = {r["item"]: r for r in s["items"]}[MATMUL]["roofline"]
    assert m["reference"] == pytest.approx(1 / 4.2) and m["compile"] == pytest.approx(0.5) and m["candidate"] is None
    table = render(s)
    assert "roof: compile" in table and "roof: candidate" not in table


def test_an_unknown_gpu_has_no_roofline_and_says_so_once():
    s = _bench("cuda Tesla V100-SXM2-16GB", {MATMUL: _timed(4.0, 1.25), RELU: _timed(2.0, 4.0)}, BASE, WORK)
    assert all(r["roofline"] is None for r in s["items"])
    assert s["roofline"]["product"] is None and "Tesla V100" in s["roofline"]["note"]
    assert set(s["roofline"]) == {"product", "note"}
    html = render(s)
    assert "roof: reference" not in html and html.count("no roofline: cuda Tesla V100") == 1
    assert cli_bench.roofline_line({**s, "device": "cuda Tesla V100-SXM2-16GB"}).startswith(
        "no roofline: cuda Tesla V100")
    assert cli_bench.roofline_line({**s, "device": "cpu AMD EPYC 7B13 x2"}) is None  # none expected on a CPU


def test_a_bench_counts_each_task_once_and_a_resume_counts_nothing(tmp_path, monkeypatch, cache_dir):
    """The bench end to end on a CPU that stands in for an H200: the work is counted before the evaluations, each
    correct result says its share of the roof as it lands, and the resumed bench reads the work back."""
    from kernelcraft.bench.run import run
    from kernelcraft.bench.sources import resolve
    from kernelcraft.protocol import Protocol

    fix = Path(__file__).parent / "fixtures"
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"ref_code": (fix / "tasks" / "tiny_elementwise.py").read_text(),
                                 "custom_code": (fix / "legit" / "torch_elementwise.py").read_text()}) + "\n")
    h200 = rl.peaks(H200)
    monkeypatch.setattr(rl, "peaks", lambda devname: h200)
    options = BenchOptions(device="cpu", baselines="eager", jobs=1, report=True,
                           protocol=Protocol.make(dict(trials=2, time_budget_s=0.3, remeasure_above=None)))

    events = []
    s = run(resolve(str(pairs), device="cpu"), tmp_path / "out", options,
            on_event=lambda kind, **d: events.append((kind, d)))
    row = s["items"][0]
    assert row["status"] == "correct" and row["roofline"]["bound_by"] == "memory"
    assert row["roofline"]["candidate"] == pytest.approx(row["roofline"]["bound_ms"] / row["cand_ms"])
    assert row["roofline"]["reference"] == pytest.approx(row["roofline"]["bound_ms"] / row["ref_ms"])
    assert s["roofline"]["product"] == "H200" and s["roofline"]["tasks"] == 1
    [result] = [d for kind, d in events if kind == "result"]
    assert result["roofline"] == pytest.approx(row["roofline"]["candidate"])
    assert [k for k, _ in events].index("roofline") < [k for k, _ in events].index("result")
    assert len(rl.load(tmp_path / "out")) == 1 and "roof: candidate" in (tmp_path / "out" / "report.html").read_text()

    monkeypatch.setattr(rl, "measure", lambda *a, **kw: pytest.fail("counted again"))
    again = run(resolve(str(pairs), device="cpu"), tmp_path / "out", options)
    assert again["resumed"] == 1 and again["items"][0]["roofline"] == row["roofline"]
