"""Stage: decoding. Hidden state -> head -> draft -> verify -> accept, one backbone call per cycle.

Takes: a Hugging Face causal LM (optionally a peft model whose last `k` layers carry the draft path's
LoRA) and an `MTPHead`; hands on: generated token ids with per-cycle statistics.
Modules: `backbone` (the verifier/draft split of one model), `drafting` (the circuit's windows and their
verify widths), `proposals` (prompt lookup), `acceptance` (the verifier's target and the speculative-sampling rule),
`decoder` (the one speculative loop, and plain decoding to compare with), `inputs` (checks of what
callers pass), `clock` (phase timing from inside the loop), `head_entry` (a head folder made ready
to decode).
"""

from .acceptance import AcceptanceRule, BlockVerification, Target
from .backbone import BackboneFamily, LlamaFamily, SplitBackbone, attach_draft_lora, family_for
from .clock import PHASES, PhaseClock, backbone_marks, split_phases
from .decoder import AdaptiveWidth, DecodeStats, GenerateOutput, SpeculativeDecoder, generate_autoregressive
from .head_entry import HeadEntry, head_info, load_head_entry
from .proposals import PromptLookup

__all__ = ["AcceptanceRule", "BlockVerification", "Target", "BackboneFamily", "LlamaFamily", "SplitBackbone", "attach_draft_lora",
           "family_for", "PHASES", "PhaseClock", "backbone_marks", "split_phases", "AdaptiveWidth", "DecodeStats",
           "GenerateOutput", "SpeculativeDecoder", "generate_autoregressive", "HeadEntry", "head_info",
           "load_head_entry", "PromptLookup"]
