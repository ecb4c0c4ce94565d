"""`mtpc tiny-lm`: train a small LlamaForCausalLM from scratch on a local corpus, over bytes or (`--tokenizer`,
`--bpe-vocab`) subword tokens.

The default corpus is the Python standard library's `.py` sources (about 30 MB, present wherever
Python is), so every machine can build the same model without a download. The result is saved with
`save_pretrained` (safetensors + `config.json`) next to the byte tokenizer's description, so it loads
like any local Hugging Face checkpoint: `LlamaForCausalLM.from_pretrained(DIR)`.

Training runs for a wall-clock budget (`minutes`) or a fixed number of `steps`; the learning rate
warms up and then follows a cosine over the budget. Held-out bits per byte count only text targets
(specials such as `<eos>` are predicted and trained but not counted as bytes): the NLL of those targets
over the bytes they stand for (a subword token's bytes: `SubwordTokenizer.byte_lengths`); a subword LM
also reports bits per token.
"""


import json
import time
from dataclasses import asdict

import torch

from .. import checks
from ..errors import InputError
from ..heads.head import save_head
from ..heads.nll_loss import valid_counts
from ..lm.tokenizer import SubwordTokenizer
from .checkpoints import append_log, write_checkpoint
from ..heads.windows import target_validity
from .data import collate, to_device
from .distributed import all_sum, barrier, init_distributed, wrap_ddp
from .loop import LoopSettings, run_loop
from .precision import autocast_dtype
from .schedule import ClockBudget, StepBudget, cosine_lr
from .tiny_lm_checkpoints import CHECKPOINT, read_checkpoint, resume_key
from .tiny_lm_model import LN2, JointLM, bits_per_byte, held_out_bits, lm_nll, mtp_val_loss
from .tiny_lm_setup import (MTP_HEAD_DIR, ShuffledOrder, TinyLMConfig, build_model, build_mtp_head, check_config,
                            check_states, datasets, lm_tokenizer, mtp_graph, optimizer, stats_dict)

__all__ = ["TinyLMConfig", "train_tiny_lm", "build_model", "JointLM", "lm_nll", "bits_per_byte", "mtp_val_loss",
           "CHECKPOINT", "MTP_HEAD_DIR", "LOG"]

LOG = "train_log.jsonl"


def train_tiny_lm(cfg: TinyLMConfig) -> dict:
    """Train (or resume from `OUT/checkpoint.pt`), evaluate and save; returns the summary also
    written to `OUT/tiny_lm.json` (on rank 0; other ranks return `{}`)."""
    from .outputs import guarded_output

    checks.output_folder(cfg.out)
    with guarded_output(cfg.out):  # one run per --out; a full disk is one line (outputs.py)
        return _TinyLMRun(cfg).run()


class _TinyLMRun:
    """One run of `mtpc tiny-lm`: set up in `__init__` (`tiny_lm_setup`). `run` hands it, as the loop's
    `Run`, to `loop.run_loop`, which calls `train_step`, `evaluate` (`tiny_lm_model`) and
    `save_checkpoint` (`tiny_lm_checkpoints`); then `run` `finish`es (rank 0)."""

    def __init__(self, cfg: TinyLMConfig):
        check_config(cfg)
        graph = mtp_graph(cfg)  # before the slow data loading: a broken circuit fails at once
        self.cfg, self.d = cfg, init_distributed(cfg.device)
        if cfg.batch_size % self.d.world:
            raise InputError(f"--batch-size {cfg.batch_size} must be divisible by the number of processes "
                             f"({self.d.world})")
        self.out = checks.output_folder(cfg.out)
        checks.data_source(cfg.data)
        self.tok = lm_tokenizer(cfg)  # a BPE is trained first: a tokenizer folder that cannot be read fails here
        if graph is not None and isinstance(self.tok, SubwordTokenizer):
            check_states(cfg, graph, self.tok.vocab_size)
        self.byte_lengths = torch.tensor(self.tok.byte_lengths())  # [V] bytes of text per id (held-out bits/byte)
        torch.manual_seed(cfg.seed)
        self.model = build_model(cfg, self.tok)  # first: the same initial LM with or without a head
        self.head = build_mtp_head(cfg, graph, self.model) if graph is not None else None
        self.model.to(self.d.device).train()
        if self.head is not None:
            self.head.to(self.d.device).train()
        self.dtype = autocast_dtype(self.d.device, cfg.precision)
        self.joint = JointLM(self.model, self.head, cfg.mtp_weight, cfg.mtp_gamma, self.dtype)
        self.ddp = wrap_ddp(self.joint, self.d)
        self.opt = optimizer(self.joint, cfg)
        self.train_set, self.val_set, self.stats = datasets(cfg, self.tok)
        if self.d.main:  # only once the data is known to be usable: a failed start leaves no folder
            self.out.mkdir(parents=True, exist_ok=True)
        self.order = ShuffledOrder(len(self.train_set), cfg.seed)
        self.step, self.tokens_seen, self.elapsed, self.start_bpb = 0, 0, 0.0, None
        self.budget = StepBudget(cfg.steps) if cfg.steps is not None else ClockBudget(cfg.minutes)
        self.loss_ema = None  # the progress bar's smoothed loss (nats)
        self.last_eval = 0.0  # when the last evaluation ended (periodic ones are `eval_every_s` apart)

    # -------------------------------------------------------------- checkpoints

    def save_checkpoint(self) -> None:
        if not self.d.main:
            return
        state = {"step": self.step, "tokens": self.tokens_seen, "elapsed": self.elapsed,
                 "start_bpb": self.start_bpb, "order": self.order.state_dict(), "torch_rng": torch.get_rng_state(),
                 "model": self.model.state_dict(), "optimizer": self.opt.state_dict(), "config": resume_key(self.cfg)}
        if self.head is not None:
            state["head"] = self.head.state_dict()
        write_checkpoint(state, self.out / CHECKPOINT)

    def load_checkpoint(self) -> bool:
        state = read_checkpoint(self.out, self.cfg)
        if state is None:
            return False
        self.model.load_state_dict(state["model"])
        if self.head is not None:
            self.head.load_state_dict(state["head"])
        self.opt.load_state_dict(state["optimizer"])
        self.order.load_state_dict(state["order"])
        self.step, self.tokens_seen, self.elapsed = int(state["step"]), int(state["tokens"]), float(state["elapsed"])
        self.start_bpb = state["start_bpb"]
        torch.set_rng_state(state["torch_rng"])
        return True

    # -------------------------------------------------------------- the run

    def run(self) -> dict:
        cfg, d = self.cfg, self.d
        resumed = self.load_checkpoint()
        self.last_eval = time.perf_counter()
        loop = LoopSettings(self.out / LOG, cfg.save_every, cfg.stop_after, cfg.progress, "tiny-lm")
        if not run_loop(self, self.budget, loop, d, resumed):
            return {"stopped_at": self.step}
        summary = self.finish() if d.main else {}
        barrier(d)
        return summary

    def first_record(self) -> dict:
        self.start_bpb = bits_per_byte(self.model, self.val_set, self.cfg.val_tokens, self.dtype,
                                       byte_lengths=self.byte_lengths)
        self.last_eval = time.perf_counter()
        return {"step": 0, "tokens": 0, "val_bpb": self.start_bpb}

    def evaluate(self, final: bool) -> dict:
        """Held-out bits per byte (rank 0) when `eval_every_s` seconds have passed since the last one."""
        if not (self.d.main and time.perf_counter() - self.last_eval >= self.cfg.eval_every_s):
            return {}
        bpb = bits_per_byte(self.model, self.val_set, self.cfg.val_tokens, self.dtype, byte_lengths=self.byte_lengths)
        self.last_eval = time.perf_counter()
        return {"val_bpb": bpb}

    def postfix(self, record: dict) -> str:
        loss = record["loss_bits"] * LN2
        self.loss_ema = loss if self.loss_ema is None else 0.95 * self.loss_ema + 0.05 * loss
        return (f"loss {self.loss_ema / LN2:.3f} bits, {self.tokens_seen / self.elapsed:,.0f} tok/s, "
                f"lr {record['lr']:.2e}" + (f", mtp {record['mtp_loss']:.3f}" if self.head else ""))

    def train_step(self) -> dict:
        cfg, d = self.cfg, self.d
        lr = cosine_lr(cfg.lr, self.budget.done, self.step, cfg.warmup_steps, cfg.min_lr_ratio)
        for group in self.opt.param_groups:
            group["lr"] = lr
        indices = self.order.take(cfg.batch_size)  # the global batch, the same on every rank
        batch = collate(self.train_set[i] for i in indices)
        ce_count = target_validity(batch["doc_ids"], batch["loss_mask"], 1)[:, :-1, 0].sum()
        mtp_counts = window_mask = None
        if self.head is not None:
            positions = torch.arange(batch["tokens"].shape[1])
            window_mask = ((positions + self.step) % cfg.mtp_window_stride == 0).expand(batch["tokens"].shape)
            mtp_counts = valid_counts(batch["doc_ids"], batch["loss_mask"], batch["tokens"], self.head.num_variables,
                                      self.head.num_states, window_mask).to(d.device)
            batch["window_mask"] = window_mask
        mine = to_device({k: t[d.rank::d.world] for k, t in batch.items()}, d.device)  # this rank's share
        loss, ce, mtp = self.ddp(mine["tokens"], mine["doc_ids"], mine["loss_mask"], ce_count.to(d.device),
                                 mtp_counts, mine.get("window_mask"))
        self.opt.zero_grad(set_to_none=True)
        (loss * d.world).backward()  # DDP averages over ranks; each rank's loss is a share of the sum
        grad_norm = torch.nn.utils.clip_grad_norm_(self.joint.parameters(), cfg.grad_clip)
        self.opt.step()
        self.step += 1
        self.tokens_seen += batch["tokens"].numel()
        ce, mtp = all_sum(torch.stack([ce, mtp]), d).tolist()
        record = {"step": self.step, "tokens": self.tokens_seen, "lr": lr, "loss_bits": ce / LN2}
        if self.head is not None:
            record["mtp_loss"] = mtp
        record["grad_norm"] = float(grad_norm)
        return record

    def finish(self) -> dict:
        cfg = self.cfg
        final_bpb, final_bpt = held_out_bits(self.model, self.val_set, cfg.final_val_tokens, self.dtype,
                                             self.byte_lengths)
        summary = {
            "val_bits_per_byte": final_bpb, "val_bits_per_byte_at_start": self.start_bpb, "steps": self.step,
            "train_tokens": self.tokens_seen, "train_seconds": round(self.elapsed, 1),
            "tokens_per_second": round(self.tokens_seen / max(self.elapsed, 1e-9)),
            "val_tokens_evaluated": min(self.val_set.num_tokens, cfg.final_val_tokens // cfg.context * cfg.context),
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "autocast": str(self.dtype) if self.dtype else "fp32", "device": str(self.d.device),
            "world_size": self.d.world,
            "data": {"source": cfg.data or "python stdlib", **stats_dict(self.stats),
                     "train_tokens": self.train_set.num_tokens, "val_tokens": self.val_set.num_tokens},
            "config": asdict(cfg),
        }
        if isinstance(self.tok, SubwordTokenizer):
            summary["val_bits_per_token"] = final_bpt
            summary["tokenizer"] = {"kind": "subword", "vocab_size": self.tok.vocab_size,
                                    "source": cfg.tokenizer or f"byte-level BPE of {cfg.bpe_vocab} tokens",
                                    "val_bytes_per_token": round(final_bpt / final_bpb, 4) if final_bpb else None}
        if self.head is not None:
            summary["mtp_head"] = {"dir": MTP_HEAD_DIR, "parameters": sum(p.numel() for p in self.head.parameters()),
                                   "val_mtp_loss": mtp_val_loss(self.joint, self.val_set, cfg.val_tokens)}
        append_log(self.out / LOG, {"final_val_bpb": final_bpb})
        self.model.save_pretrained(self.out)
        self.tok.save(self.out)
        if self.head is not None:
            save_head(self.head, self.out / MTP_HEAD_DIR)
        (self.out / "tiny_lm.json").write_text(json.dumps(summary, indent=1) + "\n")
        return summary

