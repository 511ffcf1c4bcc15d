"""Training: an LLM learns to write fast kernels on the kernelcraft reward (`kernelcraft train`).

CUDA-L1's three stages, on TRL: supervised fine-tuning on correct candidates (`sft`), self-training on the
model's own correct samples (`selftrain`), then contrastive GRPO whose prompts show earlier variants with
their measured speedups and whose reward is the reward service's verdict, checked, smoothed and clipped
(`grpo`, `rewards`). Data comes from run databases and judged pairs files (`data`); everything a run
makes lives in one directory (`pipeline`).

Design decisions
- The learner sits above the environment: it talks to the judge only through the reward service's HTTP
  API (`kernelcraft.client`), the same path any RL trainer takes, so the judge's isolation and rules are
  never bypassed and the service can run on other GPUs (a Ray pool) than training.
- TRL, transformers, peft and datasets are the optional extra `train`, imported inside functions: this
  package and the CLI import without them, and a stage that needs them says which extra to install.
- Well-kept libraries over own code: TRL's SFTTrainer and GRPOTrainer, transformers' checkpoints and
  generation, peft's LoRA, pydantic for the config. Own code where nothing fits: the reward's checks and
  smoothing, the exemplar database (the search's run databases), the hack-case table, the report.
"""
