"""Row norms on a CPU beyond the last dimension: GroupNorm and InstanceNorm as grouped rows (the affine per
channel), LayerNorm's one-pass statistics on rows longer than a tile; matches, and outputs in Triton's
interpreter."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kernelcraft.search.recipes import rewrite, tunable, tunematch, tunetemplates
from kernelcraft.task import load_task

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton_interpreter  # noqa: E402
from conftest import FIXTURES  # noqa: E402

TASKS = FIXTURES / "tasks"
NORMS = [  # (fixture, groups, affine, rows, cols)
    ("norm_group_affine", 4, True, 12, 297),
    ("norm_instance_3d", 5, True, 10, 120),
    ("norm_layer_long_row", 0, True, 3, 20000),
]


def _match(source: str):
    mod = rewrite._load_reference(source)
    model, inputs = rewrite._build(mod)
    return tunematch.match(rewrite._trace(model, inputs), model)


def _module_task(init: str, forward: str, inputs: str) -> str:
    return (f"import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def __init__(self):\n"
            f"        super().__init__()\n        self.norm = {init}\n\n    def forward(self, x):\n"
            f"        return {forward}\n\n\ndef get_inputs():\n    return [{inputs}]\n\n\n"
            f"def get_init_inputs():\n    return []\n")


@pytest.mark.parametrize("name, groups, affine, rows, cols", NORMS)
def test_grouped_and_long_norms_match(name, groups, affine, rows, cols):
    (m,) = _match(load_task(TASKS / f"{name}.py").source)
    k = m.kernel
    assert (k.op, k.groups, k.weight, k.bias) == ("layernorm", groups, affine, affine)
    assert m.shape == {"rows": rows, "cols": cols}


@pytest.mark.parametrize("init, forward, inputs", [
    ("nn.InstanceNorm2d(4, track_running_stats=True)", "self.norm(x)", "torch.rand(2, 4, 5, 5)"),  # running stats
    ("nn.InstanceNorm2d(4)", "self.norm(x)", "torch.rand(4, 5, 5)"),  # unbatched
    ("nn.GroupNorm(2, 4)", "self.norm(x) + 1", "torch.rand(2, 4, 5, 5)"),  # more than the norm
    ("nn.BatchNorm2d(4)", "self.norm(x)", "torch.rand(2, 4, 5, 5)"),  # statistics across the batch
])
def test_near_grouped_norms_are_not_matched(init, forward, inputs):
    assert _match(_module_task(init, forward, inputs)) == []


def test_groups_are_for_layernorm_only():
    with pytest.raises(tunable.TunableError, match="groups"):
        tunable.Kernel("rownorm", "float32", op="softmax", groups=4)
    with pytest.raises(tunable.TunableError, match="groups"):
        tunable.Kernel("rownorm", "float32", op="layernorm", groups=-1)
    assert "group" in tunable.describe(tunable.Match(tunable.Kernel("rownorm", "float32", op="layernorm", groups=2),
                                                     {"rows": 4, "cols": 8}))


def test_rendered_norms_are_correct_in_the_interpreter(tmp_path):
    pytest.importorskip("triton")
    cases = []
    for name, *_ in NORMS:
        t = load_task(TASKS / f"{name}.py")
        (m,) = _match(t.source)
        cfgs = tunable.all_configs(m.kernel, m.shape)
        for cfg in (cfgs[0], cfgs[-1]):  # the smallest tile (a looped row where it is longer) and the largest
            p = tmp_path / f"c{len(cases)}.py"
            p.write_text(tunetemplates.candidate_source(t.source, m, cfg))
            cases.append((t.source, str(p)))
    assert triton_interpreter.wrong_candidates(cases, tmp_path, timeout=300) == []
