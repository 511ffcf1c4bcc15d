"""For the template tests: what the tunable templates match in a task source, traced as the `recipes` analysis
traces it, and small task sources written from a forward expression."""
from __future__ import annotations

from kernelcraft.search.recipes import rewrite, tunematch


def matches(source: str) -> list:
    """`tunematch.match` on the reference in `source`, built and traced as `rewrite.analyze` does."""
    mod = rewrite._load_reference(source)
    model, inputs = rewrite._build(mod)
    return tunematch.match(rewrite._trace(model, inputs), model)


def task_source(params: str, body: str, inputs: str, *, init: str = "") -> str:
    """A task whose forward(self, `params`) returns `body`, get_inputs returns `inputs` (a list expression) and
    __init__ runs the statement `init` (on `self`) after the module's own."""
    lines = ["import torch", "import torch.nn as nn", "import torch.nn.functional as F", "", "",
             "class Model(nn.Module):"]
    if init:
        lines += ["    def __init__(self):", "        super().__init__()", f"        {init}", ""]
    lines += [f"    def forward(self, {params}):", f"        return {body}", "", "",
              "def get_inputs():", f"    return {inputs}", "", "", "def get_init_inputs():", "    return []", ""]
    return "\n".join(lines)
