"""Checks of what a caller hands the decoding loops: the prompt, the budget, EOS ids, eval mode, and the
transformers logits processors and stopping criteria the loops can honour exactly."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["check_prompt", "check_budget", "eos_set", "check_eval", "check_processors"]


def check_prompt(input_ids, vocab_size: int) -> torch.Tensor:
    if not isinstance(input_ids, torch.Tensor):
        input_ids = torch.as_tensor(input_ids, dtype=torch.long)
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [1, T] (or [T]), got shape {tuple(input_ids.shape)}")
    if input_ids.shape[0] != 1:
        raise ValueError(f"speculative decoding runs at batch size 1; got a batch of {input_ids.shape[0]} "
                         "prompts (call generate once per prompt)")
    if input_ids.shape[1] == 0:
        raise ValueError("the prompt is empty: give at least one token (e.g. a BOS token)")
    if input_ids.dtype not in (torch.long, torch.int32, torch.int64):
        raise ValueError(f"input_ids must hold integer token ids, got {input_ids.dtype}")
    if int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab_size:
        raise ValueError(f"input_ids must lie in 0..{vocab_size - 1} (the model's vocabulary)")
    return input_ids.long()


def check_budget(max_new_tokens) -> None:
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")


def eos_set(eos_token_id) -> set[int]:
    if eos_token_id is None:
        return set()
    if isinstance(eos_token_id, torch.Tensor):
        return set(eos_token_id.flatten().tolist())
    if isinstance(eos_token_id, int):
        return {eos_token_id}
    return set(int(e) for e in eos_token_id)


def check_eval(model: nn.Module) -> None:
    """Dropout in training mode would make verification random: refuse instead of silently diverging."""
    for name, module in model.named_modules():
        if isinstance(module, nn.Dropout) and module.training and module.p > 0:
            raise ValueError(f"{name} is a dropout layer in training mode; call model.eval() before decoding")


_SUPPORTED_PROCESSORS = {"TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper"}
_SUPPORTED_CRITERIA = {"MaxLengthCriteria", "EosTokenCriteria"}


def check_processors(logits_processor, stopping_criteria) -> None:
    unknown = [type(p).__name__ for p in (logits_processor or []) if type(p).__name__ not in _SUPPORTED_PROCESSORS]
    unknown += [type(c).__name__ for c in (stopping_criteria or []) if type(c).__name__ not in _SUPPORTED_CRITERIA]
    if unknown:
        raise ValueError(f"speculative decoding supports max_new_tokens/max_length, do_sample, temperature, top_k, "
                         f"top_p and eos_token_id; not {unknown}")
