"""LoRA adapters of the draft path: the folders they are read from, how peft loads and attaches them, and
which layers they adapt. Every caller that reads or attaches an adapter goes through here, so peft is
imported nowhere else; an adapter is read only from local files, never from pickles or the Hub. Torch,
peft and transformers are imported inside the functions that use them, so the command line stays quick.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

from ..errors import InputError, first_line
from ..checks import MAX_HIDDEN, MAX_LAYERS
from ..files import field, inside
from .loading import json_object, readable_folder, safetensors_file

__all__ = ["LORA_DIR", "ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "head_lora_folder", "lora_folder", "adapter_files",
           "adapter_layers", "peft_quietly", "load_lora", "is_peft", "lora_layer_indices", "lora_depth",
           "attach_draft_lora", "check_lora_layers"]

LORA_DIR = "lora"  # where `mtpc train` saves a head's draft-path adapter, inside the head folder
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def head_lora_folder(head: str | Path) -> Path | None:
    """The draft-path adapter `mtpc train` saved inside a head folder (`HEAD/lora`), if there is one."""
    folder = Path(head) / LORA_DIR
    return adapter_files(folder) if (folder / ADAPTER_CONFIG).exists() else None


def lora_folder(path: str | Path, what: str = "--lora") -> Path:
    """A peft adapter folder named by the user: `adapter_config.json` and the weights as safetensors,
    both inside the folder (an adapter is only ever read from local files)."""
    folder = readable_folder(path, f"LoRA adapter folder ({what})")
    if not (folder / ADAPTER_CONFIG).is_file():
        raise InputError(f"{what} {folder}: no {ADAPTER_CONFIG}; expected a peft adapter folder "
                         f"(mtpc train writes one to OUT/{LORA_DIR})")
    return adapter_files(folder)


def adapter_files(folder: Path) -> Path:
    """`folder` if it holds a local adapter: a checked `adapter_config.json` and `adapter_model.safetensors`
    (never pickled `adapter_model.bin`, and no Hub lookup for what is missing)."""
    folder = readable_folder(folder, "LoRA adapter folder")
    json_object(folder / ADAPTER_CONFIG, "the LoRA adapter's configuration", folder)
    weights = folder / ADAPTER_WEIGHTS
    if not weights.exists():
        pickled = (folder / "adapter_model.bin").exists()
        raise InputError(f"{folder}: no {ADAPTER_WEIGHTS}" + (" (adapter_model.bin is pickled and refused: loading "
                         "it can run code)" if pickled else " (the adapter's weights)"))
    safetensors_file(inside(weights, folder))
    return folder


def adapter_layers(folder: Path, wanted: int | None = None) -> int:
    """How many (last) decoder layers the adapter in `folder` adapts; `wanted` must agree when given."""
    file = folder / ADAPTER_CONFIG
    config = json_object(file, "the LoRA adapter's configuration", folder)
    layers = config.get("layers_to_transform") or []
    if not isinstance(layers, list) or not layers or not all(isinstance(i, int) and not isinstance(i, bool)
                                                              and 0 <= i < MAX_LAYERS for i in layers):
        raise InputError(f"{file}: layers_to_transform must be a non-empty list of layer numbers (which layers "
                         "the adapter adapts)")
    field(config, "r", file, "int", low=1, high=MAX_HIDDEN, default=None)
    if wanted is not None and wanted != len(layers):
        raise InputError(f"--lora-layers {wanted}, but the adapter in {folder} adapts the last {len(layers)} layers")
    return len(layers)


@contextlib.contextmanager
def peft_quietly():
    """Around a peft wrap or load: peft 0.21 probes `is_gradient_checkpointing`, which transformers 5
    deprecates with a FutureWarning on every call. The user can do nothing about it, so it stays out of
    their terminal; every other warning still reaches them."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def load_lora(model, folder: Path, trainable: bool = False):
    """`model` wrapped with the peft adapter saved in `folder`, read from its local files only (checked
    first by `adapter_files`, so peft never falls back to the Hub): in eval mode to decode, or with its
    adapter `trainable` (`mtpc train --init-head`, which goes on training it)."""
    from peft import PeftModel

    adapter_files(Path(folder))
    try:
        with peft_quietly():
            model = PeftModel.from_pretrained(model, str(folder), is_trainable=trainable, local_files_only=True)
        return model if trainable else model.eval()
    except (OSError, ValueError, RuntimeError, KeyError, TypeError) as e:
        raise InputError(f"{folder}: the LoRA adapter cannot be loaded: {first_line(e)}") from None


def is_peft(model) -> bool:
    """Whether `model` is a peft model (False where peft is not installed)."""
    try:
        from peft import PeftModel
    except ImportError:  # peft is a dependency, but the split works without it
        return False
    return isinstance(model, PeftModel)


def lora_layer_indices(base, layers) -> tuple[set[int], list[str]]:
    """Decoder-layer indices holding LoRA modules, and names of LoRA modules outside any decoder layer."""
    from peft.tuners.lora import LoraLayer

    owner = {id(m): i for i, layer in enumerate(layers) for m in layer.modules()}
    adapted, outside = set(), []
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            if id(module) in owner:
                adapted.add(owner[id(module)])
            else:
                outside.append(name)
    return adapted, outside


def lora_depth(model) -> int:
    """For a PeftModel: the number of trailing layers that carry adapters (0 for a plain model)."""
    from .families import decoder_layers

    if not is_peft(model):
        return 0
    base = model.get_base_model()
    layers = decoder_layers(base)
    adapted, _ = lora_layer_indices(base, layers)
    return len(layers) - min(adapted) if adapted else 0


def attach_draft_lora(model, lora_layers: int, rank: int = 8, alpha: float = 16.0,
                      dropout: float = 0.0, target_modules: tuple[str, ...] | None = None):
    """Wrap `model` into a peft `PeftModel` with LoRA adapters on its last `lora_layers` decoder layers
    (`layers_to_transform`), the layout `SplitBackbone(peft_model, lora_layers)` expects.

    peft injects the adapter modules into `model` itself (that is how peft works); nothing is copied.
    Default targets: every linear map of a layer of the model's family (`BackboneFamily.lora_targets`).
    """
    from peft import LoraConfig, get_peft_model

    from .families import split_family

    num_layers = model.config.num_hidden_layers
    check_lora_layers(lora_layers, num_layers)
    if lora_layers == 0:
        raise ValueError("attach_draft_lora needs lora_layers >= 1 (k = 0 has no draft-only layers)")
    family = split_family(model.config, "a LoRA draft path")
    targets = list(target_modules or family.lora_targets)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets,
                        layers_to_transform=list(range(num_layers - lora_layers, num_layers)),
                        layers_pattern=family.layers_pattern)
    with peft_quietly():
        return get_peft_model(model, config)


def check_lora_layers(k: int, num_layers: int) -> None:
    """`k` (`lora_layers`): how many last layers of a model of `num_layers` carry the draft path's adapters."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise ValueError(f"lora_layers must be an integer >= 0, got {k!r}")
    if k > num_layers:
        raise ValueError(f"lora_layers={k} is larger than the model's {num_layers} decoder layers")
