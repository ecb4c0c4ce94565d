"""Mixed precision for training: which autocast dtype a device runs natively, and the autocast context."""

from __future__ import annotations

import torch

__all__ = ["autocast_dtype", "autocast"]


def autocast_dtype(device: torch.device, precision: str) -> torch.dtype | None:
    """The autocast dtype for `precision` ("auto": bf16 where the hardware runs it natively)."""
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    if precision != "auto":
        raise ValueError(f"precision must be auto, fp32 or bf16, got {precision!r}")
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    return torch.bfloat16 if _cpu_has_bf16() else None


def _cpu_has_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def autocast(device: torch.device, dtype: torch.dtype | None):
    return torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None)
