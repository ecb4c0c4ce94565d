"""A repair of vLLM's CPU build that speculative sampling needs to be lossless, applied where it is broken.

vLLM 0.32's CPU platform replaces the rejection sampler's Triton kernel `expand_kernel` (it spreads each request's
temperature, top-k and top-p over that request's draft positions) with a C++ one called through
`vllm.utils.cpu_triton_utils._expand_kernel_impl`, which casts the output and the input to new int64 tensors: a
float32 output (the temperatures, the top-p) is never written, and is left as `torch.empty` made it. The target's
logits at the drafted positions are then divided by whatever that memory held (zeros: +-inf logits, NaN
probabilities), and at any temperature above 0 the rejection sampler keeps drafted tokens the target gives
probability 0 and draws the others from garbage. Greedy decoding never reads them. Measured here with vLLM's own
`ngram` proposer as with mtpc's: after `"def all_s"` the byte LM's second token was the draft `" "` 83% of the time,
where the model gives it probability 0.000.

`repair_cpu_rejection_sampler()` tests vLLM's expansion on a float tensor and, where it is wrong, registers a
correct one through vLLM's own kernel-override registry (`vllm.triton_utils.dispatcher.register_kernels`, the way the
CPU platform registers its kernels). Where vLLM's expansion is right (a GPU, a fixed release) it changes nothing. The
proposer calls it inside the engine's worker, where the rejection sampler runs; an engine without mtpc's proposer
(vLLM's `ngram`) keeps the bug.
"""

from __future__ import annotations

import torch

__all__ = ["expand_is_correct", "repair_cpu_rejection_sampler", "expand_by_request"]

EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


def expand_by_request(output: torch.Tensor, input: torch.Tensor, cu_num_tokens: torch.Tensor, replace_from,
                      replace_to, MAX_NUM_TOKENS=None) -> None:  # noqa: N803 (the kernel's own argument names)
    """`expand_kernel` in torch: request `i`'s value `input[i]` (`replace_to` where it is `replace_from`) written to
    its positions `cu_num_tokens[i - 1] .. cu_num_tokens[i] - 1` of `output` `[num_tokens]`, in `output`'s dtype."""
    if input.numel() == 0:
        return
    ends = cu_num_tokens.to(torch.long)  # [B]
    counts = torch.diff(ends, prepend=ends.new_zeros(1))  # [B] positions per request
    values = torch.where(input == replace_from, torch.full_like(input, replace_to), input)  # [B]
    output[:int(ends[-1])] = values.repeat_interleave(counts).to(output.dtype)


def expand_is_correct() -> bool:
    """Whether vLLM's rejection sampler spreads float values (the temperatures) over draft positions correctly."""
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    values = torch.tensor([0.5, -1.0, 2.0])
    ends = torch.tensor([1, 3, 6], dtype=torch.int32)
    expanded = expand_batch_to_tokens(values, ends, 6, replace_from=-1, replace_to=1)
    return expanded.tolist() == [0.5, 1.0, 1.0, 2.0, 2.0, 2.0]


def repair_cpu_rejection_sampler() -> bool:
    """Register `expand_by_request` as vLLM's expansion where vLLM's own is wrong; True when it did. Raises
    `MtpcError` when the expansion is still wrong after the repair (sampling would not be lossless)."""
    from vllm.triton_utils.dispatcher import register_kernels

    from ..errors import MtpcError

    if expand_is_correct():
        return False
    register_kernels({EXPAND_KERNEL: expand_by_request})
    if not expand_is_correct():
        raise MtpcError("vLLM's rejection sampler spreads temperatures over draft positions wrongly and mtpc could "
                        "not repair it: sampling with speculative decoding would not be lossless")
    return True
