"""Training: an LLM learns to write fast kernels on the kernelcraft reward (`kernelcraft train`).

CUDA-L1's three stages on TRL: SFT on correct candidates (`sft`), self-training on the model's own correct
samples (`selftrain`), then contrastive GRPO rewarded by the reward service's verdicts, checked, smoothed and
clipped (`grpo`, `rewards`). Data comes from run databases and judged pairs files (`data`); everything a run
makes lives in one directory (`pipeline`). `learn` and `ablation` run the stages on a stand-in policy.
The judge is reached only through an evaluator's `evaluate_batch` (the reward service's client in a training
run). TRL, transformers, peft and datasets (extra `train`) are imported inside functions. Usage: docs/train.md.

Rationale: docs/design/train.md#__init__
"""
