"""Stage: decoding. Hidden state -> head -> draft -> verify -> accept, one backbone call per cycle.

Takes: a Hugging Face causal LM (optionally a peft model whose last `k` layers carry the draft path's
LoRA) and an `MTPHead`; hands on: generated token ids with per-cycle statistics.
Modules: `backbone` (the verifier/draft split of one model), `drafting` (the circuit's windows and their
verify widths), `proposals` (prompt lookup's matching), `proposers` (what drafts a window: the circuit,
prompt lookup, any host proposer), `trees` (a tree of drafts: its budget, the circuit's choice), `acceptance` (the speculative-sampling rule), `cycle` (a cycle's named
data), `compiling` (compiled cycle steps), `decoder` (the one speculative loop), `plain` (the one plain
decoder), `stats` (what both hand back), `inputs` (checks of what callers pass), `clock` (phase timing
from inside the loop), `head_entry` (a head folder made ready to decode).
"""

from .acceptance import AcceptanceRule, BlockVerification
from .backbone import BackboneFamily, LlamaFamily, SplitBackbone, attach_draft_lora, family_for
from .clock import PHASES, PhaseClock, backbone_marks, split_phases
from .decoder import AdaptiveWidth, SpeculativeDecoder
from .plain import PlainDecoder
from .stats import DecodeStats, GenerateOutput
from .head_entry import HeadEntry, head_info, load_head_entry
from .proposals import PromptLookup
from .proposers import HostProposer, LookupProposer, Outcome, RowView, RowWindow
from .trees import TreeBudget

__all__ = ["AcceptanceRule", "BlockVerification", "BackboneFamily", "LlamaFamily", "SplitBackbone", "attach_draft_lora",
           "family_for", "PHASES", "PhaseClock", "backbone_marks", "split_phases", "AdaptiveWidth", "DecodeStats",
           "GenerateOutput", "SpeculativeDecoder", "PlainDecoder", "HeadEntry", "head_info",
           "load_head_entry", "PromptLookup", "HostProposer", "LookupProposer", "Outcome", "RowView", "RowWindow",
           "TreeBudget"]
