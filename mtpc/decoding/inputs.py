"""Checks of what a caller hands the decoding loops: the prompt (one row, or a left-padded batch and its
attention mask), the budget, the batch's memory, EOS ids, eval mode, and the transformers logits
processors and stopping criteria the loops can honour exactly."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["check_prompt", "check_batch", "check_budget", "check_memory", "available_memory", "eos_set", "check_eval",
           "check_processors", "checked_switch"]


def check_prompt(input_ids, vocab_size: int) -> torch.Tensor:
    """One prompt `[1, T]` (or `[T]`) of token ids in the vocabulary -> `[1, T]` long."""
    input_ids = _ids(input_ids)
    if input_ids.shape[0] != 1:
        raise ValueError(f"plain decoding runs at batch size 1; got a batch of {input_ids.shape[0]} "
                         "prompts (call it once per prompt)")
    return _tokens(input_ids, vocab_size)


def check_batch(input_ids, attention_mask, vocab_size: int, context: int | None) -> tuple[torch.Tensor, list[int]]:
    """A batch of left-padded prompts `[B, T]` (or one `[T]`) and its `attention_mask` `[B, T]` (1 for a
    real token, 0 for padding, which must all come first in a row; None: no padding) -> (`[B, T]` long,
    each row's padding). A row longer than the model's `context` (None: unknown) is refused."""
    input_ids = _ids(input_ids)
    B, T = input_ids.shape
    if B == 0:
        raise ValueError("input_ids holds no prompt (batch size 0)")
    pads = [0] * B
    if attention_mask is not None:
        mask = torch.as_tensor(attention_mask)
        mask = mask[None] if mask.dim() == 1 else mask
        if tuple(mask.shape) != (B, T):
            raise ValueError(f"attention_mask must have the shape of input_ids {(B, T)}, got {tuple(mask.shape)}")
        if mask.is_floating_point() or mask.is_complex() or not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError("attention_mask must hold only 0 (padding) and 1 (a real token)")
        mask = mask.long().cpu()
        pads = (T - mask.sum(1)).tolist()
        left_padded = mask.cummax(1).values.eq(mask).all(1)  # [B] once a 1, never a 0 again
        bad = [b for b in range(B) if not bool(left_padded[b]) or pads[b] == T]
        if bad:
            raise ValueError(f"attention_mask row {bad[0]} is not left padding (0s, then at least one 1, with no 0 "
                             "after a 1): pad prompts on the left, as tokenizer(..., padding_side='left') does")
    if context is not None and T - min(pads) > context:
        longest = max(range(B), key=lambda b: T - pads[b])
        raise ValueError(f"prompt row {longest} holds {T - pads[longest]} tokens, more than the model's context of "
                         f"{context} positions")
    return _tokens(input_ids, vocab_size), pads


def check_memory(need: int, available: int | None, what: str, purpose: str, fix: str) -> None:
    """Refuse, before allocating, what `what` (a batch, a `max_context`) needs for `purpose` (`need` bytes)
    where it would not fit in the `available` bytes (None: unknown, not checked); the refusal states both,
    and `fix`."""
    if available is not None and need > available:
        raise ValueError(f"{what} needs about {need / 2**30:.2f} GiB ({need:,} bytes) for {purpose}, more than the "
                         f"{available / 2**30:.2f} GiB ({available:,} bytes) available: {fix}")


def available_memory(device: torch.device) -> int | None:
    """Bytes free for new tensors on `device`: CUDA's free memory, else the host's available memory
    (Linux `MemAvailable`); None where unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _ids(input_ids) -> torch.Tensor:
    if not isinstance(input_ids, torch.Tensor):
        input_ids = torch.as_tensor(input_ids, dtype=torch.long)
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [B, T] (or [T]), got shape {tuple(input_ids.shape)}")
    return input_ids


def _tokens(input_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    if input_ids.shape[1] == 0:
        raise ValueError("the prompt is empty: give at least one token (e.g. a BOS token)")
    if input_ids.dtype not in (torch.long, torch.int32, torch.int64):
        raise ValueError(f"input_ids must hold integer token ids, got {input_ids.dtype}")
    if int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab_size:
        raise ValueError(f"input_ids must lie in 0..{vocab_size - 1} (the model's vocabulary)")
    return input_ids.long()


def checked_switch(name: str, value) -> bool:
    """A decoder's on/off argument (`compile`): True or False, never a value that is only truthy."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


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
