"""`mtpc train`: train an MTP circuit head (and optionally LoRA adapters) on a frozen byte-level LM.

    mtpc train --model DIR --circuit FILE.pc [-D k=v]... [--data PATH] [--lora-layers k] --out DIR

- The backbone is frozen; the head (initialised from the LM head, so that it starts as the fully
  factorised product of per-position LM softmaxes) and, with `k > 0`, LoRA adapters on the last `k`
  decoder layers (peft `layers_to_transform`) are trained with AdamW, a warm-up + cosine schedule,
  gradient clipping, gradient accumulation and bf16 autocast where the hardware has it.
- The loss (`--loss`) is `nll`, the windowed likelihood of the gold bytes (`mtpc.heads.nll_loss.mtp_loss`),
  `kl`, the KL from the frozen LM's own next-byte distributions to the head's conditionals
  (`mtpc.heads.kl_loss.kl_loss`, the paper's Appendix J; the teacher is the verifier path, adapters off),
  or `nll+kl`, their plain sum (each term already weighted by gamma and averaged per window
  position, so the two are on the same per-byte nats scale). Every loss is normalised by the counts
  of the whole global batch, so gradient accumulation and data parallelism give the same update as
  one big batch.
- Under `torchrun --nproc_per_node N` the same command trains with DistributedDataParallel (NCCL on
  GPUs, gloo on CPUs); each rank takes every N-th sequence of each micro-batch.
- Validation (rank 0) reports the loss and the teacher-forced mean accepted length of the circuit's
  greedy draft on held-out windows, and on the same windows the top-1/2/4/8 acceptance at each drafted
  depth (`val_depth_topk` in the summary, `train_config.json`).
- `OUT/checkpoint.pt` holds everything needed to resume exactly (trainable weights, optimizer, step
  and schedule, data position, RNG states: tensors and plain values only, loaded with
  `torch.load(weights_only=True)`, so a planted file cannot run code). Rerunning the same command
  continues from it; a command whose settings differ from the checkpoint's is refused with the list
  of differing settings, except `RESUMABLE` ones (`--steps`/`--minutes` extend or shorten the run:
  the schedule is re-stretched to the new length from the current step on).
- Inputs are checked before any slow work (`mtpc.checks`): model folder, circuit, init head, data,
  output folder. A non-finite loss or gradient stops the run with an `MtpcError` at that step,
  before the optimizer touches the weights; the last checkpoint stays as it was.
- `OUT` is self-describing: `head.safetensors` + `head.json` (graph spec; `mtpc.load_head(OUT)`),
  `lora/` (peft adapter, when `k > 0`), `train_config.json`, `train_log.jsonl`.
- Two-stage schedule: `--init-head DIR` continues from a trained head (and its adapter, if any),
  e.g. adding `--lora-layers k` in the second stage.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
from torch.profiler import record_function

from ..lm import loading
from ..lm.lora import LORA_DIR
from ..errors import MtpcError
from ..heads.nll_loss import valid_counts
from .checkpoints import rng_state, set_rng_state, write_checkpoint
from .data import EpochSampler, PackedDataset, collate, load_documents, split_documents, to_device
from .features import FeatureSet
from .vocabulary import choose_vocabulary, coverage, token_counts
from .distributed import all_sum, barrier, init_distributed, wrap_ddp
from .loop import LoopSettings, run_loop
from .precision import autocast_dtype
from .schedule import StepBudget, cosine_lr
from .trainer_checkpoints import (CHECKPOINT, CHECKPOINT_FORMAT, load_trainable, read_checkpoint, settings,
                                  trainable_state)
from .trainer_setup import (DraftModel, TrainConfig, build_head, check_inputs, load_init_head,
                            load_lm, vocabulary_choice)
from . import trainer_validation

__all__ = ["TrainConfig", "Trainer", "train", "DraftModel", "build_head", "load_lm", "CHECKPOINT", "LOG"]

LOG = "train_log.jsonl"


class Trainer:
    """One run of `mtpc train`: set up in `__init__` (`trainer_setup`). `run` hands it, as the loop's
    `Run`, to `loop.run_loop`, which calls `train_step`, `evaluate` (validation, `trainer_validation`)
    and `save_checkpoint` (`trainer_checkpoints`); then `run` writes the head."""

    def __init__(self, cfg: TrainConfig, announce: Callable[[str], None] | None = None):
        self.cfg, self.d = cfg, init_distributed(cfg.device)
        torch.manual_seed(cfg.seed)
        self.out = Path(cfg.out)
        # Everything a user can get wrong is checked here, before the model and the data are loaded.
        self.init = load_init_head(cfg) if cfg.init_head else None
        self.graph = check_inputs(cfg, self.init, self.d.world)
        info = self.info = loading.model_info(cfg.model, allow_non_byte_vocab=True,
                                              trust_remote_code=cfg.trust_remote_code)
        self.vocabulary = vocabulary_choice(cfg, info, self.init)
        self.tok = loading.model_tokenizer(info, self.vocabulary.subword, cfg.trust_remote_code)
        if announce is not None and self.vocabulary.line and self.d.main:
            announce(self.vocabulary.line)  # which head reads the vocabulary, and why: before any slow work
        self.resume_state = read_checkpoint(self.out, cfg, self.graph)
        self.lm = load_lm(cfg, self.d.device)
        self.train_set, self.val_set = self._data()
        self.draft_vocabulary = self._draft_vocabulary(info.vocab_size)
        self.head = build_head(cfg, self.lm, self.d.device, self.graph, self.init,
                               self.draft_vocabulary["tokens"] if self.draft_vocabulary else None)
        self.saved_step = self.resume_state["step"] if self.resume_state else None
        self.amp = autocast_dtype(self.d.device, cfg.precision)
        self.module = DraftModel(self.lm, self.head, cfg.gamma, cfg.chunk_elements, self.amp, cfg.loss)
        self.ddp = wrap_ddp(self.module, self.d)
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        self.opt = self._optimizer()
        self.sampler = EpochSampler(len(self.train_set), cfg.seed)
        # --minutes: a step count re-sized after every step (from the checkpoint's time per step on a resume)
        self.budget = StepBudget(cfg.steps, None if cfg.steps is not None else cfg.minutes)
        self.step, self.tokens, self.elapsed = 0, 0, 0.0
        self.last_val = None  # the validation of the final step, reused for the summary

    def _data(self) -> tuple[PackedDataset | FeatureSet, PackedDataset | FeatureSet]:
        if self.cfg.features is not None:  # the LM's cached hidden states of the store's own sequences
            self.data_stats = None
            tokenizer = type(self.tok).__name__
            inner = self.cfg.lora_layers > 0  # the LoRA layers run from their cached input (--draft-layers)
            return tuple(FeatureSet(self.cfg.features, split, self.info, tokenizer, inner) for split in ("train", "val"))
        docs, self.data_stats = load_documents(self.cfg.data, self.tok)
        train_docs, val_docs = split_documents(docs, self.cfg.val_fraction)
        L = self.cfg.seq_len
        return PackedDataset(train_docs, L, self.tok.pad_id), PackedDataset(val_docs, L, self.tok.pad_id)

    def _draft_vocabulary(self, vocab_size: int) -> dict | None:
        """`--draft-vocab K`: the K tokens the LM (or the text) most often has next on the training split,
        and the share of each split's tokens they cover."""
        if self.cfg.draft_vocab is None:
            return None
        counts = token_counts(self.train_set, vocab_size)
        tokens = choose_vocabulary(counts, self.cfg.draft_vocab)
        source = "the LM's greedy next tokens" if self.cfg.features else "the training text's tokens"
        return {"tokens": tokens, "size": len(tokens), "chosen_from": source,
                "train_coverage": round(coverage(tokens, counts), 4),
                "val_coverage": round(coverage(tokens, token_counts(self.val_set, vocab_size)), 4)}

    def _optimizer(self) -> torch.optim.Optimizer:
        head = [p for p in self.head.parameters() if p.requires_grad]
        lora = [p for p in self.lm.parameters() if p.requires_grad]
        groups = [{"params": head, "lr": self.cfg.lr, "base_lr": self.cfg.lr}]
        if lora:
            groups.append({"params": lora, "lr": self.cfg.lora_lr, "base_lr": self.cfg.lora_lr})
        return torch.optim.AdamW(groups, weight_decay=self.cfg.weight_decay)

    # -------------------------------------------------------------- one step

    def train_step(self) -> dict:
        cfg, d = self.cfg, self.d
        indices = self.sampler.take(cfg.batch_size)  # the global batch, the same on every rank
        batch = collate(self.train_set[i] for i in indices)
        n, v = self.head.num_variables, self.head.num_states
        batch["window_mask"] = self._window_mask(batch["tokens"].shape)
        normalizer = valid_counts(batch["doc_ids"], batch["loss_mask"], self.head.states_of(batch["tokens"]), n, v,
                                  batch["window_mask"]).to(d.device)
        for group in self.opt.param_groups:
            group["lr"] = cosine_lr(group["base_lr"], self.budget.done, self.step, cfg.warmup_steps, cfg.min_lr_ratio)
        self.opt.zero_grad(set_to_none=True)
        micro = cfg.batch_size // cfg.grad_accum
        loss_sum = torch.zeros((), device=d.device)
        for m in range(cfg.grad_accum):
            mine = list(range(m * micro + d.rank, (m + 1) * micro, d.world))  # this rank's share
            part = to_device({k: t[mine] for k, t in batch.items()}, d.device)
            sync = m == cfg.grad_accum - 1 or d.world == 1
            with self._no_sync(not sync):
                loss, _, _ = self.ddp(part["tokens"], part["doc_ids"], part["loss_mask"], normalizer,
                                      part["window_mask"], hidden=part.get("hidden"), inner=part.get("inner"))
                with record_function("mtpc.backward"):  # phase labels: benchmarks/bench_train_step.py
                    (loss * d.world).backward()  # DDP averages over ranks; each loss is a share of the sum
            loss_sum += loss.detach()
        with record_function("mtpc.optimizer"):
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip)
        total = all_sum(loss_sum, d).item()  # the same on every rank, so all ranks stop together
        if not (math.isfinite(total) and math.isfinite(float(grad_norm))):
            what = f"loss {total}" if not math.isfinite(total) else f"gradient norm {float(grad_norm)}"
            raise MtpcError(f"non-finite {what} at step {self.step + 1}; training stopped before the update. "
                            f"{self._kept()} (lower --lr, or check the model's weights and the data)")
        with record_function("mtpc.optimizer"):
            self.opt.step()
        self.step += 1
        self.tokens += int(batch["tokens"].numel())
        return {"step": self.step, "loss": total, "grad_norm": float(grad_norm), "lr": self.opt.param_groups[0]["lr"],
                "tokens": self.tokens}

    def _window_mask(self, shape: torch.Size) -> torch.Tensor:
        """`[B, T]`: positions `t` with `(t + step) % window_stride == 0` (all with stride 1)."""
        s = self.cfg.window_stride
        positions = torch.arange(shape[1])
        return ((positions + self.step) % s == 0).expand(shape)

    def _no_sync(self, skip: bool):
        import contextlib

        return self.ddp.no_sync() if skip and self.d.world > 1 else contextlib.nullcontext()

    def validate(self) -> dict:
        return trainer_validation.validate(self.module, self.val_set, self.cfg, self.d.device)

    def first_record(self) -> dict:
        return {"step": 0, **self.validate()}

    def evaluate(self, final: bool) -> dict:
        """Validation (rank 0) every `val_every` steps and at the last one."""
        val = {}
        if self.step % self.cfg.val_every == 0 or final:
            if self.d.main:
                val = self.validate()
                self.last_val = val if final else None
            barrier(self.d)
        return val

    def postfix(self, record: dict) -> str:
        return (f"loss {record['loss']:.3f}, {self.tokens / max(self.elapsed, 1e-9):,.0f} tok/s"
                + (f", accepted {record['val_accepted']:.2f}" if "val_accepted" in record else ""))

    # -------------------------------------------------------------- checkpoints and outputs

    def save_checkpoint(self) -> None:
        if not self.d.main:
            return
        self._check_finite()
        state = {
            "format": CHECKPOINT_FORMAT, "step": self.step, "total_steps": self.budget.total,
            "budget": {"steps": self.cfg.steps, "minutes": self.cfg.minutes}, "tokens": self.tokens,
            "elapsed": self.elapsed, "trainable": trainable_state(self.module), "optimizer": self.opt.state_dict(),
            "sampler": self.sampler.state_dict(), "rng": rng_state(), "settings": settings(self.cfg, self.graph),
        }
        write_checkpoint(state, self.out / CHECKPOINT)
        self.saved_step = self.step

    def load_checkpoint(self) -> bool:
        state = self.resume_state
        if state is None:
            return False
        load_trainable(self.module, state, self.out / CHECKPOINT)
        self.opt.load_state_dict(state["optimizer"])
        self.sampler.load_state_dict(state["sampler"])
        self.step, self.tokens, self.elapsed = state["step"], state["tokens"], state["elapsed"]
        set_rng_state(state["rng"])
        return True

    def _check_finite(self) -> None:
        bad = [k for k, p in self.module.named_parameters() if p.requires_grad and not torch.isfinite(p).all()]
        if bad:
            raise MtpcError(f"non-finite weights ({', '.join(bad[:3])}) at step {self.step}; nothing saved. "
                            f"{self._kept()}")

    def _kept(self) -> str:
        if self.saved_step is None:
            return (f"No checkpoint was written yet (the first is due at step {self.cfg.save_every}, "
                    "see --save-every).")
        return f"{self.out / CHECKPOINT} keeps step {self.saved_step}."

    def save_outputs(self, summary: dict) -> None:
        if not self.d.main:
            return
        from ..heads.head import save_head

        self._check_finite()
        save_head(self.head, self.out)
        if self.cfg.lora_layers > 0:
            self.lm.save_pretrained(str(self.out / LORA_DIR))
        config = {**asdict(self.cfg), "model": str(Path(self.cfg.model).resolve()), "lora_dir": LORA_DIR
                  if self.cfg.lora_layers > 0 else None, "world_size": self.d.world, **summary}
        (self.out / "train_config.json").write_text(json.dumps(config, indent=1) + "\n")

    # -------------------------------------------------------------- the run

    def run(self) -> dict:
        cfg, d = self.cfg, self.d
        resumed = self.load_checkpoint()
        if d.main:
            self.out.mkdir(parents=True, exist_ok=True)
        loop = LoopSettings(self.out / LOG, cfg.save_every, cfg.stop_after, cfg.progress, "mtpc train")
        if not run_loop(self, self.budget, loop, d, resumed):
            return {"stopped_at": self.step}
        final = (self.last_val if self.last_val is not None else self.validate()) if d.main else {}
        stats = self.data_stats
        rate = round(self.tokens / self.elapsed) if self.elapsed > 0 else None  # of the whole run, resumes included
        data = {"features": str(Path(cfg.features).resolve()), "sequences": len(self.train_set)} if stats is None \
            else {"documents": stats.documents, "skipped_empty": stats.skipped_empty,
                  "skipped_corrupt": stats.skipped_corrupt, "skipped_binary": stats.skipped_binary}
        summary = {"steps": self.step, "train_tokens": self.tokens, "train_seconds": round(self.elapsed, 1),
                   "tokens_per_second": rate, "data": data, **final}
        if self.draft_vocabulary:
            summary["draft_vocabulary"] = {k: v for k, v in self.draft_vocabulary.items() if k != "tokens"}
        self.save_outputs(summary)
        barrier(d)
        return summary


def train(cfg: TrainConfig, announce: Callable[[str], None] | None = None) -> dict:
    """Train (or resume) and write the outputs; returns the summary. `announce` gets one line first when
    the model's vocabulary is not byte-level (which head reads it, and why). Bad input raises `InputError`
    before slow work; a run that fails raises `MtpcError`. An output folder this call created is
    removed again if the run fails before writing anything into it."""
    from .. import checks
    from .outputs import guarded_output

    checks.output_folder(cfg.out)
    with guarded_output(cfg.out):  # one run per --out; a full disk is one line (outputs.py)
        return Trainer(cfg, announce).run()

