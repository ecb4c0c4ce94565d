"""Stage: decoding. Hidden state -> head -> draft -> verify -> accept, one backbone call per cycle.

Takes: a Hugging Face causal LM (optionally a peft model whose last `k` layers carry the draft path's
LoRA) and an `MTPHead`; hands on: generated token ids with per-cycle statistics.
Rooms: `cycle/` (the one speculative loop, the verify call, acceptance, a cycle's data), `drafts/` (windows,
trees and proposers: what a cycle verifies), `choice/` (measured costs and the choice of plain, chain or tree).
Beside them: `plain` (the one plain decoder), `pace` (a speculative generation handed to plain decoding
when its cycles fall behind a plain step), `compiling` (compiled cycle steps), `stats` (what both decoders
hand back), `inputs` (checks of what callers pass), `clock` (phase timing from inside the loop), `head_entry`
(a head folder made ready to decode). How a model's layers are called is `mtpc.lm`'s.
"""

from .cycle.acceptance import AcceptanceRule, BlockVerification
from .clock import PHASES, PhaseClock, backbone_marks, split_phases
from .cycle.decoder import AdaptiveWidth, SpeculativeDecoder
from .plain import PlainDecoder
from .pace import PaceCheck, generate_paced, measured_pace
from .stats import DecodeStats, GenerateOutput
from .head_entry import HeadEntry, head_info, load_head_entry
from .drafts.proposals import PromptLookup
from .drafts.proposers import HostProposer, LookupProposer, Outcome, RowView, RowWindow
from .drafts.trees import TreeBudget

__all__ = ["AcceptanceRule", "BlockVerification", "PHASES", "PhaseClock", "backbone_marks", "split_phases", "AdaptiveWidth", "DecodeStats",
           "GenerateOutput", "SpeculativeDecoder", "PlainDecoder", "PaceCheck", "generate_paced", "measured_pace", "HeadEntry", "head_info",
           "load_head_entry", "PromptLookup", "HostProposer", "LookupProposer", "Outcome", "RowView", "RowWindow",
           "TreeBudget"]
