"""What the machine at hand is, as far as choosing how to decode goes: the processor's name and whether it runs
bfloat16 matrix products natively.

A CPU without native bfloat16 kernels (no AVX-512 BF16, no AMX: for example an AVX2-only EPYC) converts to float32
inside every bf16 matmul, and a forward over k positions then costs about k times one position (measured here:
8 positions 4.25x one step in bf16, 2.02x in float32). Only `/proc/cpuinfo` is read (Linux; elsewhere the flags
are unknown and bfloat16 counts as not native), and oneDNN's instruction-set limit: torch's CPU matrix products
run through oneDNN, and `ONEDNN_MAX_CPU_ISA=AVX2` on a CPU with AMX makes its bf16 products what they are on an
AVX2-only one (measured on a Xeon with AMX: 8 rows of a 576 x 1536 bf16 product 7.5x one row, 1.05x without it).
"""

from __future__ import annotations

import os
import platform
from functools import lru_cache
from pathlib import Path

__all__ = ["cpu_name", "cpu_flags", "isa_limit", "native_bf16", "machine_summary"]

CPUINFO = Path("/proc/cpuinfo")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # x86 instructions for bf16 dot products; arm's "bf16" too
MAX_CPUINFO_BYTES = 4 << 20  # a machine with hundreds of cores writes a few hundred KiB
# oneDNN's instruction-set limits below its bf16 kernels (its ISA names; AVX2_VNNI_2 and AVX512_CORE_BF16 have them)
NO_BF16_ISAS = frozenset({"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI"})


@lru_cache(maxsize=1)
def _cpuinfo_lines() -> tuple[str, ...]:
    try:
        with CPUINFO.open("rb") as f:
            return tuple(f.read(MAX_CPUINFO_BYTES).decode("utf-8", "replace").splitlines())
    except OSError:
        return ()


def _first_value(*keys: str) -> str | None:
    for line in _cpuinfo_lines():
        name, _, value = line.partition(":")
        if name.strip() in keys:
            return value.strip()
    return None


def cpu_name() -> str:
    """The processor's model name ('AMD EPYC 7B13'), or what the platform module says."""
    return _first_value("model name", "Model", "Hardware") or platform.processor() or platform.machine() or "unknown"


def cpu_flags() -> frozenset[str]:
    """The first processor's feature flags ('flags' on x86, 'Features' on arm); empty where unknown."""
    return frozenset((_first_value("flags", "Features") or "").split())


def isa_limit() -> str | None:
    """oneDNN's instruction-set limit (`ONEDNN_MAX_CPU_ISA`, or the older `DNNL_MAX_CPU_ISA`), upper-cased; None
    when neither is set."""
    value = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    return value.strip().upper()[:64] if value and value.strip() else None


def native_bf16(device: str = "cpu") -> bool:
    """Whether bfloat16 matrix products run natively on `device`: always on CUDA (Ampere and later run bf16
    matmuls in hardware; older cards emulate it, and torch says so), on a CPU only with a bf16 instruction set
    that oneDNN is not limited below (`isa_limit`)."""
    if str(device).startswith("cuda"):
        import torch

        return bool(torch.cuda.is_bf16_supported())
    flags = cpu_flags()
    return (any(flag in flags for flag in BF16_FLAGS) or "bf16" in flags) and isa_limit() not in NO_BF16_ISAS


def machine_summary(device: str = "cpu") -> str:
    """One line for tables: 'AMD EPYC 7B13, AVX2, no native bf16'."""
    if str(device).startswith("cuda"):
        import torch

        return f"{torch.cuda.get_device_name()}, native bf16" if native_bf16(device) else torch.cuda.get_device_name()
    flags = cpu_flags()
    vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else platform.machine()
    limit = f", oneDNN limited to {isa_limit()}" if isa_limit() else ""
    return f"{cpu_name()}, {vector}{limit}, {'native' if native_bf16() else 'no native'} bf16"
