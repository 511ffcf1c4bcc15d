"""Stage 1 (`kernelcraft train sft`): supervised fine-tuning on correct candidates, with TRL's SFTTrainer.

Loss on the completion only; LoRA through peft when `model.lora` is set, the merged model saved. Also the
fine-tuning step of every self-training round. Resumes from the newest complete checkpoint; a stage whose
`model/` exists is skipped.

Rationale: docs/design/train.md#sft
"""
from __future__ import annotations

from pathlib import Path

from kernelcraft.train.checkpoints import final_model, last_checkpoint
from kernelcraft.train.metrics import MetricsLog, trainer_callback
from kernelcraft.train.models import TrainError, load_model, load_tokenizer, lora_config, require, save_merged


def fine_tune(cfg, examples: list[dict], *, init_model: str | Path, stage_dir: Path, settings, log: MetricsLog,
              stage: str = "sft", round: int | None = None) -> Path:
    """Fine-tune `init_model` on `examples` (rows with `prompt` and `completion` messages) -> stage_dir/model."""
    done = final_model(stage_dir)
    if done is not None:
        return done
    if not examples:
        raise TrainError(f"{stage}: no training examples (see the dataset card in {cfg.out_dir / 'data'})")
    trl = require("trl")
    datasets = require("datasets")
    tok = load_tokenizer(init_model)
    model = load_model(init_model, dtype=cfg.model.dtype)
    rows = [{"prompt": e["prompt"], "completion": e["completion"]} for e in examples]
    args = trl.SFTConfig(
        output_dir=str(stage_dir), num_train_epochs=settings.epochs, max_steps=settings.max_steps or -1,
        learning_rate=settings.learning_rate, lr_scheduler_type=settings.lr_scheduler,
        per_device_train_batch_size=settings.batch_size, gradient_accumulation_steps=settings.grad_accum,
        max_length=settings.max_length, save_strategy="steps", save_steps=settings.save_steps,
        save_total_limit=settings.save_total_limit, logging_steps=settings.logging_steps, report_to=[],
        use_cpu=cfg.device == "cpu", bf16=cfg.device != "cpu", seed=cfg.seed, data_seed=cfg.seed,
        disable_tqdm=True, gradient_checkpointing=cfg.model.gradient_checkpointing, dataset_num_proc=None)
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows),
                             processing_class=tok, peft_config=lora_config(cfg.model.lora),
                             callbacks=[trainer_callback(log, stage, round)])
    resume = last_checkpoint(stage_dir)
    if resume is not None:
        log.write(stage, 0, {"resumed_from_step": int(resume.name.split("-")[1])}, round=round)
        print(f"kernelcraft train {stage}: resuming from {resume}", flush=True)
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    return save_merged(trainer.model, tok, stage_dir / "model")
