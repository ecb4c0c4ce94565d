"""Stage: serving. An mtpc head drafting inside a serving engine: vLLM's speculative decoding.

Takes: a head folder (and, to check it early, the model folder vLLM will serve); hands on: the keyword arguments
of `vllm.LLM` / the JSON of `vllm serve` (`vllm_options`), and inside the engine the proposer vLLM builds from
them (`CircuitHeadProposer`), which drafts from the target's hidden states with mtpc's own drafting code.
Modules: `options` (the options and every check that runs before an engine starts; imports neither vLLM nor
torch), `vllm_proposer` (the proposer, imported by vLLM inside its engine). Imported lazily: nothing here is
loaded, and vLLM never, unless used.
"""

from ..lazy import lazy_getattr

_EXPORTS = {
    "vllm_options": "options", "ProposerSettings": "options", "check_vllm_version": "options",
    "installed_vllm_version": "options", "SUPPORTED_VLLM": "options", "CircuitHeadProposer": "vllm_proposer",
}
__all__ = list(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
