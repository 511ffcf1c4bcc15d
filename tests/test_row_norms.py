"""Row norms on a CPU beyond the last dimension: GroupNorm and InstanceNorm as grouped rows (the affine per
channel), norms over the channels at each position, LayerNorm's one-pass statistics on rows longer than a
tile; matches, and outputs in Triton's interpreter."""
from __future__ import annotations

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
NORMS = [  # (fixture, op, groups, channels, affine, rows, cols)
    ("norm_group_affine", "layernorm", 4, False, True, 12, 297),
    ("norm_instance_3d", "layernorm", 5, False, True, 10, 120),
    ("norm_layer_long_row", "layernorm", 0, False, True, 3, 20000),
    ("norm_channels_rms", "rmsnorm", 0, True, False, 189, 12),
    ("norm_channels_softmax", "softmax", 0, True, False, 144, 5),
]



@pytest.mark.parametrize("name, op, groups, channels, affine, rows, cols", NORMS)
def test_grouped_channel_and_long_norms_match(name, op, groups, channels, affine, rows, cols):
    (m,) = template_match.matches(load_task(TASKS / f"{name}.py").source)
    k = m.kernel
    assert (k.op, k.groups, k.channels, k.weight, k.bias) == (op, groups, channels, affine, affine)
    assert m.shape == {"rows": rows, "cols": cols}


@pytest.mark.parametrize("init, forward, inputs", [
    ("nn.InstanceNorm2d(4, track_running_stats=True)", "self.norm(x)", "torch.rand(2, 4, 5, 5)"),  # running stats
    ("nn.InstanceNorm2d(4)", "self.norm(x)", "torch.rand(4, 5, 5)"),  # unbatched
    ("nn.GroupNorm(2, 4)", "self.norm(x) + 1", "torch.rand(2, 4, 5, 5)"),  # more than the norm
    ("nn.BatchNorm2d(4)", "self.norm(x)", "torch.rand(2, 4, 5, 5)"),  # statistics across the batch
    ("nn.Softmax(dim=2)", "self.norm(x)", "torch.rand(2, 4, 5, 5)"),  # neither the channels nor the last dimension
    ("nn.Softmax(dim=1)", "self.norm(x)", "torch.rand(2, 4096, 5)"),  # more channels than a tile holds
    ("nn.LayerNorm(4)", "self.norm(x.transpose(1, 3)).transpose(1, 3)", "torch.rand(2, 4, 5, 5)"),  # a layout
])
def test_near_grouped_norms_are_not_matched(init, forward, inputs):
    source = template_match.task_source("x", forward, f"[{inputs}]", init=f"self.norm = {init}")
    assert template_match.matches(source) == []


def test_groups_are_for_layernorm_only_and_channels_for_plain_norms():
    with pytest.raises(tunable.TunableError, match="groups"):
        tunable.Kernel("rownorm", "float32", op="softmax", groups=4)
    with pytest.raises(tunable.TunableError, match="groups"):
        tunable.Kernel("rownorm", "float32", op="layernorm", groups=-1)
    with pytest.raises(tunable.TunableError, match="channels"):
        tunable.Kernel("rownorm", "float32", op="rmsnorm", channels=True, weight=True)
    k = tunable.Kernel("rownorm", "float32", op="softmax", channels=True)
    assert [c for c in tunable.all_configs(k, {"rows": 4096, "cols": 600}) if c["BLOCK_N"] < 1024 * 16] == []
    assert "channels" in tunable.describe(tunable.Match(k, {"rows": 64, "cols": 5}))
    assert "group" in tunable.describe(tunable.Match(tunable.Kernel("rownorm", "float32", op="layernorm", groups=2),
                                                     {"rows": 4, "cols": 8}))


def test_rendered_norms_are_correct_in_the_interpreter(tmp_path):
    pytest.importorskip("triton")
    cases = []
    for name, *_ in NORMS:
        t = load_task(TASKS / f"{name}.py")
        (m,) = template_match.matches(t.source)
        cfgs = tunable.all_configs(m.kernel, m.shape)
        for cfg in (cfgs[0], cfgs[-1]):  # the smallest tile (a looped row where it is longer) and the largest
            p = tmp_path / f"c{len(cases)}.py"
            p.write_text(tunetemplates.candidate_source(t.source, m, cfg))
            cases.append((t.source, str(p)))
    assert triton_interpreter.wrong_candidates(cases, tmp_path, timeout=300) == []
