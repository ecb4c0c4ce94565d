"""A head folder made ready to decode: the head, the model its decoder runs (the base model, or a
PeftModel with the head's draft-path LoRA adapter), and what a report says about the head."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..lm import loading, lora
from ..errors import InputError
from ..files import read_json
from ..heads import MTPHead, load_head

__all__ = ["HeadEntry", "load_head_entry", "head_info"]


@dataclass
class HeadEntry:
    """One head folder, loaded: the head, the model its decoder runs (a PeftModel with the head's LoRA
    adapter, or the shared base model), and what the report says about it."""

    label: str
    path: str
    head: MTPHead
    model: torch.nn.Module
    lora_layers: int
    info: dict


def load_head_entry(path: str, base: torch.nn.Module, model_path: str, dtype: torch.dtype,
                    head_dtype: torch.dtype | None, device: torch.device, *,
                    trust_remote_code: bool = False) -> HeadEntry:
    """A head folder written by `mtpc train` (or `save_head`): head, LoRA adapter if any, its config.
    `trust_remote_code` is passed on to loading the adapter's own copy of the model."""
    from safetensors import SafetensorError

    folder = loading.head_folder(path)
    try:
        head = load_head(folder, device=device)
    except (ValueError, KeyError, OSError, SafetensorError) as e:
        raise InputError(f"head folder {path}: {e}") from None
    head = head.to(head_dtype) if head_dtype is not None else head
    if head.parameterisation == "tied":  # its input units are the model's own output layer, never saved
        head.tie_to(base.get_output_embeddings())
    head.eval()
    train_cfg = _read_json(folder / "train_config.json")
    lora_dir = lora.head_lora_folder(folder)
    model, k = base, 0
    if lora_dir is not None:
        k = lora.adapter_layers(lora_dir)
        model = lora.load_lora(loading.load_model(model_path, dtype, device, trust_remote_code=trust_remote_code),
                                  lora_dir)
    info = head_info(head, train_cfg, k)
    return HeadEntry(folder.name, str(folder), head, model, k, info)


def head_info(head: MTPHead, train_cfg: dict, lora_layers: int) -> dict:
    """Structure, window, size and training summary of a head, for the report."""
    circuit = train_cfg.get("circuit")
    structure = Path(circuit).stem if isinstance(circuit, str) and circuit.endswith((".pc", ".json")) else None
    if structure is None:
        structure = "ff" if head.num_leaves == head.num_variables else "circuit"
    return {"structure": structure, "bindings": train_cfg.get("bindings", {}), "n": head.num_variables,
            "leaves": head.num_leaves, "parameters": head.num_weights(),
            "parameterisation": head.parameterisation, "head_dtype": str(head.dtype).removeprefix("torch."),
            "lora_layers": lora_layers, "train_steps": train_cfg.get("steps"),
            "train_seconds": train_cfg.get("train_seconds"), "val_loss": train_cfg.get("val_loss"),
            "val_accepted": train_cfg.get("val_accepted")}


def _read_json(path: Path) -> dict:
    exists = path.exists() or path.is_symlink()
    return read_json(path, "the head's training settings", folder=path.parent) if exists else {}
