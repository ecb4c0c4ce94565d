"""Lossless self-speculative decoding with a circuit draft head (MtPC, Algorithm 2), and plain decoding.

One loop and one step for every batch size, eager or compiled alike. `generate` takes one prompt or a
batch of left-padded prompts `[B, T]` with their `attention_mask`; every row keeps its own length and
positions in the static caches, and rows advance by different amounts each cycle. Before a cycle the
decoder holds, on the device, each row's next `Window` `[x_0, d_1 .. d_{S-1}]`: `x_0` already decided
(the verifier's next token: its argmax, or a draw from its target or from a residual), the circuit's
draft conditioned on it, the proposal rows and its verify width (the decoder's fixed width, or with
`AdaptiveWidth` the one the row's draft chose). A cycle is two fixed-shape steps for the whole batch,
`verify_step` (1) and `decide_step` (2, 3):

1. one backbone call on the windows' first `W` tokens (`W` the widest row's width: every row verifies
   the same width, each tests only its own) at each row's own slots and positions in static caches
   (`Verifier.forward`): the verifier's targets `p_1 .. p_W` and the draft path's hidden states;
2. `accept_window` decides every drafted token of every row at once on the device (greedy: equal to
   `argmax p_j`; sampling: block verification against the proposal's exact conditionals, or the
   token-by-token Leviathan/Chen rule) and draws each row's next `x_0` from the target at its last
   accepted position, or from the rule's residual `norm(max(0, w p_j - r_j))` when a tested token
   after it was not kept (`w` = 1 token by token; so the deferred token is still exactly distributed);
3. the circuit drafts each row's next window after that `x_0`, from the hidden state there
   (`Drafter.circuit_window`), with its verify width; when sampling, at the target's temperature (each
   conditional sharpened as the verifier's distribution is, `draft_temperature`).

The host then reads one small tensor for the batch (`CyclePacket`: per row the accepted count, the
next `x_0` and width, the window's tokens), advances each row's length in the caches by its committed
tokens (rejected rows stay in the static caches, hidden by the mask, and are overwritten by the row's
next call), and starts the next cycle. Rows that finished (EOS or budget) still ride in the
fixed-shape step but test nothing and their results are dropped. Every cycle makes one backbone call
and commits 1 .. width tokens per row; greedy output equals plain greedy decoding of each row alone,
sampled output is exactly distributed as the verifier's shaped target, row by row. Every draw of a
sampling cycle comes from one uniforms tensor per row (`cycle_uniforms`), so a seed gives the same text
eager and compiled, and with one generator per row a row's text depends on its own generator only;
with `compile=True` each step is one graph per verify width (the verify step, the model's call, apart:
it reads no sampling setting, so greedy and sampling cycles share it, and it alone takes the time of a
first compile).

A tree (`tree=N`, `mtpc.decoding.drafts.trees`) runs the same loop and step: the window is the circuit's tree of
`N` nodes with its `WindowShape`, the verify call puts each node at its depth's position and lets it see
its ancestors, `accept_tree` keeps a path, and the step moves that path's keys and values to the slots
after the committed text, so the host reads and commits it as a chain's accepted tokens.

Proposers only propose (`mtpc.decoding.drafts.proposers`): the circuit drafts inside the step, and before a
cycle each host proposer (prompt lookup with `lookup=K`, or any of `proposers=[...]`) may replace a
row's circuit window with its own (point-mass proposals, decided by the same rule: a token `c` is kept
with probability `p(c)`, its residual is `p` without `c`, renormalised); its choice reads only the
row's past, so decoding stays exact. Its window enters the same step; after the cycle every host
proposer observes what each row kept. The decoder holds no proposer's bookkeeping.

Also usable from transformers: `model.generate(ids, custom_generate=decoder.custom_generate, ...)`
(transformers 5.x accepts a callable; see `SpeculativeDecoder.custom_generate`). Streaming: any
transformers `BaseStreamer` (`TextStreamer`, `TextIteratorStreamer`) as `generate(..., streamer=)`;
in a batch it streams row 0.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Callable, Iterable, Sequence

import torch
from torch import nn

from circuitc.runtime.kernels import inverse_cdf

from ...checks import MAX_LOOKUP_TOKENS, tree_and_window
from ...heads import MTPHead
from ...lm.backbone import SplitBackbone
from ...sampling import GREEDY, Sampling, check_draft_temperature
from ..compiling import StepVariant, StepVariants, VerifyVariant, derived_identity, tensor_layout
from ..drafts.drafting import AdaptiveWidth, Drafter, Window, WindowShape
from ..drafts.layout import WindowLayout
from ..drafts.proposals import PromptLookup
from ..drafts.proposers import CircuitProposer, HostProposer, LookupProposer, Outcome, RowView
from ..drafts.trees import TreeBudget, tree_budget
from ..inputs import (available_memory, check_batch, check_budget, check_eval, check_memory, check_processors,
                      checked_switch, eos_set)
from ..stats import DecodeStats, GenerateOutput, pad_id, padded_sequences
from .acceptance import (AcceptanceRule, BlockVerification, TreeProposals, Verdict, accept_tree, accept_window,
                         cycle_uniforms)
from .data import CyclePacket, CycleSettings, Pending, Row, StepOutput
from .host import HostReads
from .verify import Places, Verifier, context_reserve

__all__ = ["AdaptiveWidth", "SpeculativeDecoder"]

log = logging.getLogger(__name__)

MAX_PROPOSER_SPAN = 1 + MAX_LOOKUP_TOKENS  # a host proposer's longest window: x_0 and a lookup match's tokens


class SpeculativeDecoder:
    """Self-speculative decoding of `model` (verifier) with `head` drafting from the draft path.

    `lora_layers`: the last `k` layers run twice (`SplitBackbone`). `lookup`: prompt lookup as a host proposer
    (`K` tokens per match, or a `PromptLookup`); `proposers`: more host proposers, asked after it. `window`:
    the circuit windows' verify width (2 .. n; default n) or an `AdaptiveWidth`. `compile`: the cycle's
    verify and decide steps through `torch.compile`, one graph each per verify width, kept for later
    generations (on the CPU also on disk). `acceptance`: the speculative-sampling rule (default
    `BlockVerification`; `AcceptanceRule()` is token by token). `draft_temperature`: what the circuit samples
    at (None: the target's temperature; any is exact). `max_context`: positions its caches hold from the start (compiled: one compile a process).
    `tree`: verify a tree of drafts per cycle instead of a chain (a node budget, or a `TreeBudget`; see
    `mtpc.decoding.drafts.trees`). `family`: a `BackboneFamily` for a family mtpc does not know. The host reads one
    small tensor per cycle through `host_reads`, and one after the prefill."""

    def __init__(self, model: nn.Module, head: MTPHead, lora_layers: int = 0, *, lookup: int | PromptLookup | None = None,
                 proposers: Sequence[HostProposer] = (), window: int | AdaptiveWidth | None = None,
                 compile: bool = False, acceptance: AcceptanceRule | None = None,
                 draft_temperature: float | None = None, max_context: int | None = None,
                 tree: int | TreeBudget | None = None, family=None):
        self.backbone = SplitBackbone(model, lora_layers, family=family)
        check_head(head, self.backbone)
        self.head, self.n = head, head.num_variables
        self.lookup = PromptLookup.of(lookup)
        tree = checked_tree(tree, head, self.backbone, window, self.lookup, proposers)
        spans = tuple(p.span for p in checked_proposers(proposers))
        layout = WindowLayout.build(self.n, window, tree, self.lookup.tokens if self.lookup else 0, spans)
        self.settings = CycleSettings(layout, checked_acceptance(acceptance),
                                      checked_draft_temperature(draft_temperature), self.backbone.k)
        self.drafter = Drafter(head, layout.widths, layout.position_cost, layout.span, self.backbone.vocab_size)
        self.circuit = CircuitProposer(self.drafter, layout)
        lookups = [LookupProposer(self.lookup, self.drafter, layout)] if self.lookup is not None else []
        self.proposers: list[HostProposer] = lookups + list(proposers)
        self.verifier = Verifier(self.backbone, context_reserve(self.backbone.config, max_context, compile))
        self.compile, self.host_reads = checked_switch("compile", compile), HostReads()
        self.compiled = CompiledCycle(self)

    @property
    def layout(self) -> WindowLayout:
        return self.settings.layout

    @property
    def width(self) -> int:  # the widest verify width of a circuit window
        return self.layout.widest

    # ----------------------------------------------------------------- public API

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, sampling: Sampling = GREEDY, *,
                 eos_token_id: int | Iterable[int] | None = None,
                 generator: torch.Generator | list[torch.Generator] | None = None, streamer=None, phase_clock=None,
                 attention_mask: torch.Tensor | None = None, pad_token_id: int | None = None,
                 pace=None) -> GenerateOutput:
        """Generate up to `max_new_tokens` tokens after each prompt of `input_ids` (`[B, T]`, or `[T]`),
        each row stopping after its first EOS, tokens following `sampling` exactly (greedy by default).
        A batch: `attention_mask` `[B, T]` (1 for real tokens, 0 for padding) marks left-padded prompts
        of different lengths. `sequences` is `[B, T + m]`, `m` the longest row's new tokens: the prompt
        columns as given, then each row's tokens, then `pad_token_id` (default: the model's pad id, else
        the first EOS id, else 0). `generator`: one `torch.Generator`, or one per row (a row's text then
        depends on its own alone). `phase_clock`: a `PhaseClock` (compiled: one without hooks), stamped at
        the start (`backbone_start`) and end (`step_end`) of every cycle step. `streamer`: a transformers
        `BaseStreamer`, fed as transformers' loops feed it (the prompt `[1, T]`, each cycle's tokens `[1, k]`,
        `end()`); in a batch, row 0's. `pace`: a `mtpc.decoding.pace.PaceCheck`, asked before each cycle
        whether the cycles so far fall behind plain decoding (then the generation stops with its rows still
        live: `mtpc.decoding.pace.generate_paced` hands them to plain decoding; the first row is judged)."""
        if not isinstance(sampling, Sampling):
            raise TypeError(f"sampling must be a mtpc.sampling.Sampling (GREEDY, or Sampling(temperature=...)), "
                            f"got {type(sampling).__name__}")
        context = getattr(self.backbone.config, "max_position_embeddings", None)
        prompt, pads = check_batch(input_ids, attention_mask, self.backbone.vocab_size, context)
        check_budget(max_new_tokens)
        check_eval(self.backbone.model)
        B, T = prompt.shape
        self.check_batch(B, T, max_new_tokens, prompt.device, generator)
        eos = eos_set(eos_token_id)
        stats = DecodeStats()
        if streamer is not None:
            streamer.put(prompt[:1, pads[0]:].cpu())
        rows = [Row(max_new_tokens, live=max_new_tokens > 0) for _ in range(B)]
        if max_new_tokens:
            stamp = phase_clock.stamp if phase_clock is not None else _no_stamp
            pending = self._start(prompt, pads, sampling, eos, generator, rows, stats, stamp)
            stop = False  # a pace's stop: the last "cycle" commits each row's decided x_0 (a residual's draw, say)
            while any(row.live for row in rows) and not stop:
                start, stop = time.perf_counter(), paced_stop(pace, stats, rows[0])
                committed, width, pending = self._cycle(pending, rows, eos, sampling, generator, stats, stamp, stop)
                stats.record(time.perf_counter() - start, committed, width)
                for row, tokens in zip(rows, committed):
                    row.add(tokens, eos)
                if streamer is not None and committed[0]:
                    streamer.put(torch.tensor([committed[0]], dtype=torch.long))
        if streamer is not None:
            streamer.end()
        pad = pad_id(self.backbone.config, eos, pad_token_id)
        return GenerateOutput(padded_sequences(prompt, [row.new for row in rows], pad), stats)

    # ----------------------------------------------------------------- one generation

    def _start(self, prompt: torch.Tensor, pads: list[int], sampling: Sampling, eos: set[int], generator,
               rows: list[Row], stats: DecodeStats, stamp) -> Pending:
        """The prefill, the compiled steps made ready, the proposers started, and the first windows: each
        row's `x_0` from the target at its prompt's last token and the circuit's draft after it."""
        start = time.perf_counter()
        stamp("backbone_start")
        logits, h = self.verifier.start(prompt, pads, rows[0].left + self.layout.span)
        self.eos_ids = torch.tensor(sorted(eos) or [-1], dtype=torch.long, device=prompt.device)
        if self.compile:
            compiling = time.perf_counter()
            self._warm(h, sampling)
            stats.compile_seconds = time.perf_counter() - compiling
            start += stats.compile_seconds
            announce_compile(self.verifier, stats.compile_seconds, self.compiled.fresh)
        stamp("backbone_end")  # after the compiling: the phase clock counts it with the prefill, not a cycle
        for proposer in self.proposers:
            proposer.start([prompt[b, pads[b]:].tolist() for b in range(len(rows))])
        uniforms = cycle_draws(sampling, generator, h, self.layout.draws.total)
        if sampling.greedy:
            first = logits.argmax(-1)  # [B]
        else:
            first = inverse_cdf(sampling.probs(logits), self.layout.draws.of_decide(sampling, uniforms, 1)[:, 0])
        window = self.circuit.draft(h, first, sampling, self.layout.draws.of_draft(sampling, uniforms),
                                    sampling.draft_temperature(self.settings.draft_temperature))
        firsts, widths = self.host_reads(torch.stack([window.tokens[:, 0], window.width]))
        for row, first_token, width in zip(rows, firsts, widths):
            row.first, row.width = first_token, width
        stats.prefill_seconds = time.perf_counter() - start
        return Pending(window, h)

    def _cycle(self, pending: Pending, rows: list[Row], eos: set[int], sampling: Sampling, generator,
               stats: DecodeStats, stamp, stop: bool = False) -> tuple[list[list[int]], int, Pending]:
        """Verify and accept the live rows' windows, draft the next ones. A row whose `x_0` ends it (or every
        live row, at a `stop`) commits it without verifying. Returns (each row's committed ids, the verified
        width, 0 when nothing was verified, the next pending windows)."""
        ends = [row.live and stop or row.ends_with_first(eos) for row in rows]
        verify = [row.live and not end for row, end in zip(rows, ends)]
        committed = [[row.first] if end else [] for row, end in zip(rows, ends)]
        if not any(verify):
            return committed, 0, pending
        uniforms = cycle_draws(sampling, generator, pending.hidden, self.layout.draws.total)
        window, widths, lengths, drafted_by = self._windows(pending, rows, verify, sampling, uniforms)
        stats.count_windows([name for name, v in zip(drafted_by, verify) if v])
        W = max(w for w, v in zip(widths, verify) if v)
        limit = [min(length, row.left) if v else 1 for length, row, v in zip(lengths, rows, verify)]
        places = self.verifier.places(W)
        verify_step, decide_step = self.compiled.steps(sampling, W, len(rows))
        stamp("backbone_start")  # compiled steps: their acceptance and draft count as the backbone's
        logits, hidden = verify_step(window.tokens, window.shape, places)
        out = decide_step(sampling, window, places.slots, logits, hidden,
                          torch.tensor(limit, device=pending.hidden.device), self.eos_ids, uniforms)
        stamp("step_end")
        packet = CyclePacket.read(self.host_reads, out.packet)
        accepted = [a if v else 0 for a, v in zip(packet.accepted, verify)]
        self.verifier.commit(accepted)
        for b in (b for b, v in enumerate(verify) if v):
            committed[b] = packet.tokens[b][:accepted[b]]
            for proposer in self.proposers:
                proposer.observe(Outcome(b, accepted[b], committed[b], drafted_by[b]))
        for row, first_token, width in zip(rows, packet.next_first, packet.next_width):
            row.first, row.width = first_token, width
        return committed, W, Pending(out.window, out.hidden)

    def _windows(self, pending: Pending, rows: list[Row], verify: list[bool], sampling: Sampling, uniforms
                 ) -> tuple[Window, list[int], list[int], list[str]]:
        """The cycle's windows: the circuit's, with a row's replaced by the first host proposer that
        proposes one. Returns (windows, per row the verify width, the real tokens, the proposer's name)."""
        window, widths, drafted_by = pending.window, [row.width for row in rows], [self.circuit.name] * len(rows)
        lengths = [min(w, self.n) for w in widths]
        if not self.proposers:  # the circuit's windows as drafted: no per-row views to build
            return window, widths, lengths, drafted_by
        temperature = sampling.draft_temperature(self.settings.draft_temperature)
        for b in (b for b, v in enumerate(verify) if v):
            draws = self.layout.draws.of_fill(sampling, uniforms, b)  # never the next window's draws
            view = RowView(b, rows[b].first, pending.hidden[b], draws, sampling, temperature, pending.window)
            for proposer in self.proposers:
                proposal = proposer.propose(view)
                if proposal is not None:
                    window = window.with_row(b, proposal.window.padded(self.layout.span))
                    widths[b], lengths[b], drafted_by[b] = proposal.width, proposal.length, proposer.name
                    break
        return window, widths, lengths, drafted_by

    def verify_step(self, tokens: torch.Tensor, shape: WindowShape, places: Places
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A cycle's first step (compiled: one graph, which greedy and sampling cycles share): the first `W`
        of the windows' `tokens` `[B, span]` at `places` (`[B, W]` slots and positions; in a tree's layout, of
        `shape`: a node at its depth's position, seeing its ancestors) -> logits `[B, W, V]`, draft hidden
        `[B, W, d]`."""
        W = places.slots.shape[1]
        places = places if self.layout.tree is None else places.for_tree(shape, self.layout.depth)
        return self.verifier.forward(tokens[:, :W], places)

    def decide_step(self, sampling: Sampling, window: Window, slots: torch.Tensor, logits: torch.Tensor,
                    hidden: torch.Tensor, limit: torch.Tensor, eos_ids: torch.Tensor, uniforms: torch.Tensor | None
                    ) -> StepOutput:
        """A cycle's second step (compiled: one graph) after `verify_step` of `window` at `slots` `[B, W]`:
        accept (`limit` `[B]`: the tokens each row may commit, 1 for a row that tests nothing; `eos_ids` `[E]`)
        and draft the next windows. `uniforms` (sampling; None when greedy): every draw of the cycle, split as
        the layout's `draws` (`CycleDraws`) says."""
        W, layout, draws = slots.shape[1], self.layout, self.layout.draws
        tokens = window.tokens[:, :W]  # [B, W]
        verdict = decide(sampling, self.settings.acceptance, window, logits, hidden, limit, eos_ids, layout,
                         draws.of_decide(sampling, uniforms, W), self.circuit.tree_proposals(window, W, sampling))
        if layout.tree is not None:  # the accepted path to consecutive slots; its tokens are the committed ones
            self.verifier.keep_path(slots, verdict.path)
            tokens = tokens.gather(1, verdict.path)  # [B, D + 1]
        nxt = self.circuit.draft(verdict.hidden, verdict.next_first, sampling, draws.of_draft(sampling, uniforms),
                                 sampling.draft_temperature(self.settings.draft_temperature))
        return StepOutput(CyclePacket.pack(verdict.accepted, nxt, tokens), nxt, verdict.hidden)

    def check_batch(self, B: int, T: int, max_new_tokens: int, device: torch.device, generator=None) -> None:
        """Refuse (`ValueError`, `refuse_batch`) a batch `[B, T]` this decoder cannot run, before allocating."""
        refuse_batch(self.verifier, self.layout.span, B, T, max_new_tokens, device, generator)

    # ----------------------------------------------------------------- compiled steps

    def _warm(self, h: torch.Tensor, sampling: Sampling) -> None:
        """Make ready, on this generation's caches and cycle-shaped inputs, the steps of every verify width (the
        growing attended length is their one dynamic dimension); the first cycle overwrites rows written here."""
        B = h.shape[0]
        uniforms = cycle_draws(sampling, None, h, self.layout.draws.total)
        first = torch.zeros(B, dtype=torch.long, device=h.device)
        window = self.circuit.draft(h, first, sampling, self.layout.draws.of_draft(sampling, uniforms), 1.0)
        self.compiled.start()
        for width in sorted(set(self.layout.widths).union(*(p.widths for p in self.proposers))):
            limit = torch.full((B,), width, device=h.device)
            self.compiled.make_ready(sampling, window, self.verifier.places(width), limit, uniforms)

    # ----------------------------------------------------------------- transformers integration

    def custom_generate(self, model, input_ids, logits_processor=None, stopping_criteria=None,
                        generation_config=None, mtpc_streamer=None, **model_kwargs):
        """`model.generate(input_ids, custom_generate=decoder.custom_generate, max_new_tokens=..., ...)`:
        transformers 5.x prepares the generation config (max length, do_sample, temperature, top_k, top_p,
        eos, pad) and calls this as its decoding loop; a left-padded batch with its `attention_mask` as
        well. Other logits processors or stopping criteria are refused (they would change the target).
        Streaming: `mtpc_streamer=...` (transformers hands a callable only the arguments its own loop
        lacks, so a plain `streamer=` would get the prompt and nothing after it). Returns the sequences (a
        `GenerateDecoderOnlyOutput` with `return_dict_in_generate`); `decoder.generate` gives the stats."""
        if model is not self.backbone.base and model is not self.backbone.model:
            raise ValueError("custom_generate belongs to a SpeculativeDecoder built for another model")
        check_processors(logits_processor, stopping_criteria)
        cfg = generation_config
        sampling = Sampling.from_transformers(bool(cfg.do_sample), cfg.temperature, cfg.top_k, cfg.top_p)
        out = self.generate(input_ids, cfg.max_length - input_ids.shape[-1], sampling, eos_token_id=cfg.eos_token_id,
                            streamer=mtpc_streamer, attention_mask=model_kwargs.get("attention_mask"),
                            pad_token_id=cfg.pad_token_id)
        if cfg.return_dict_in_generate:
            from transformers.generation.utils import GenerateDecoderOnlyOutput

            return GenerateDecoderOnlyOutput(sequences=out.sequences)
        return out.sequences


class CompiledCycle:
    """A compiled decoder's two cycle steps: its verify step (the model's call over a window; `VerifyVariant`s,
    which greedy and sampling cycles share) and its acceptance-and-draft step (`StepVariant`s), each variant made
    ready before a generation's first cycle (`make_ready`) and handed out per cycle (`steps`: the eager step of
    a variant not made ready; a cycle never compiles)."""

    def __init__(self, decoder: SpeculativeDecoder):
        self.decoder = decoder
        self.verify = StepVariants(decoder.verify_step, partial(verify_identity, decoder))
        self.decide = StepVariants(decoder.decide_step, partial(step_identity, decoder),
                                   partial(decide_savable, decoder))
        self.layouts: tuple[tuple, tuple] = ((), ())  # the model's tensors; the model's and the head's (`start`)

    @property
    def fresh(self) -> int:  # variants this generation compiled or loaded
        return self.verify.fresh + self.decide.fresh

    def start(self) -> None:
        """A new generation: every variant made ready again, for the tensors the model and head hold now."""
        model_layout = tensor_layout(self.decoder.backbone.model)
        self.layouts = model_layout, model_layout + tensor_layout(self.decoder.head)
        self.verify.start()
        self.decide.start()

    def steps(self, sampling: Sampling, width: int, batch: int) -> tuple[Callable, Callable]:
        verify, decide = self._variants(sampling, width, batch)
        return self.verify.step_for(verify), self.decide.step_for(decide)

    def make_ready(self, sampling: Sampling, window: Window, places: Places, limit: torch.Tensor,
                   uniforms: torch.Tensor | None) -> None:
        """Ready the variants of a cycle of `window` at `places` (its verify step run once, for the logits and
        hidden states its acceptance step is made ready on)."""
        B, width = places.slots.shape
        verify, decide = self._variants(sampling, width, B)
        verify_args = (window.tokens, window.shape, places)
        self.verify.make_ready(verify, self.layouts[0], verify_args, [places.kv_slots])
        logits, hidden = self.verify.step_for(verify)(*verify_args)
        args = (sampling, window, places.slots, logits, hidden, limit, self.decoder.eos_ids, uniforms)
        self.decide.make_ready(decide, self.layouts[1], args, [])

    def _variants(self, sampling: Sampling, width: int, batch: int) -> tuple[VerifyVariant, StepVariant]:
        allocation = self.decoder.verifier.allocations
        return (VerifyVariant(allocation, width, batch),
                StepVariant(sampling, self.decoder.eos_ids.numel(), allocation, width, batch))


# --------------------------------------------------------------------------- checks and sizes

def paced_stop(pace, stats: DecodeStats, row: Row) -> bool:
    """Whether `pace` (a `PaceCheck`, or None: never) says the generation, its first row live, is behind plain
    decoding."""
    return pace is not None and row.live and pace.behind(stats)


def check_head(head: MTPHead, backbone: SplitBackbone) -> None:
    """The head fits the model: its hidden size, and every token it can draft is in the model's vocabulary."""
    if not isinstance(head, MTPHead):
        raise ValueError(f"head must be an MTPHead (mtpc.load_head, or MTPHead(...)), got {type(head).__name__}")
    if head.hidden_size != backbone.hidden_size:
        raise ValueError(f"the head was built for hidden size {head.hidden_size}, the model's is {backbone.hidden_size}")
    if head.max_token_id >= backbone.vocab_size:
        what = (f"circuit has {head.num_states} states (token ids 0..{head.num_states - 1})" if head.vocabulary
                is None else f"draft vocabulary names token ids up to {head.max_token_id}")
        raise ValueError(f"the head's {what} but the model's vocabulary has only {backbone.vocab_size} tokens")


def checked_tree(tree, head: MTPHead, backbone: SplitBackbone, window, lookup, proposers) -> TreeBudget | None:
    """The decoder's tree (`tree_budget`), refused where this decoder cannot verify one: with a verify
    width of its own, with host proposers other than prompt lookup, or on a model without a family adapter
    (its own forward attends causally; a tree needs the slot caches' mask)."""
    budget = tree_budget(tree, head.num_variables, head.num_states)
    if budget is None:
        return None
    tree_and_window((budget.nodes,), (window,))  # the rule mtpc generate and mtpc bench check before loading
    if proposers:
        raise ValueError("tree with host proposers is not supported yet (prompt lookup is: its matches become "
                         "branches of the tree): decode with one of them")
    backbone.require_slot_caches("a tree of drafts", "decode chains (no tree), or pass family=LlamaFamily() if its decoder follows the Llama layout")
    return budget


def decide(sampling: Sampling, rule: AcceptanceRule, window: Window, logits: torch.Tensor, hidden: torch.Tensor,
           limit: torch.Tensor, eos_ids: torch.Tensor, layout: WindowLayout, uniforms: torch.Tensor | None,
           proposals: TreeProposals | None = None) -> Verdict:
    """A cycle's acceptance of its verified `window` (the first `W` tokens of each row, `logits` `[B, W, V]`):
    a chain's by `accept_window` and `rule`, a tree's by `accept_tree` (its verdict carries the path;
    `proposals`: what a sampled tree was drawn from)."""
    W = logits.shape[1]
    tokens = window.tokens[:, :W]
    if layout.tree is not None:
        shape = window.shape.first(W)
        return accept_tree(sampling, rule, tokens, shape.parents, shape.depths, logits, hidden, limit, eos_ids, uniforms,
                           min(layout.depth, W - 1), proposals)  # a call without a lookup branch: shallower trees
    rows = None if window.rows is None else window.rows[:, :W]
    return accept_window(sampling, rule, tokens, logits, hidden, limit, eos_ids, rows, uniforms, window.width)


def checked_acceptance(rule: AcceptanceRule | None) -> AcceptanceRule:
    """The speculative-sampling rule: an `AcceptanceRule` (None: `BlockVerification()`, the default)."""
    if rule is None:
        return BlockVerification()
    if not isinstance(rule, AcceptanceRule):
        raise ValueError(f"acceptance must be None or an AcceptanceRule (BlockVerification(), AcceptanceRule()), "
                         f"got {rule!r}")
    return rule


def checked_proposers(proposers: Sequence[HostProposer]) -> Sequence[HostProposer]:
    """Host proposers: a list or tuple of objects with a proposer's `name`, `widths`, `span` (tokens of its
    longest window, 1 .. `MAX_PROPOSER_SPAN`) and `start`, `propose`, `observe`."""
    if not isinstance(proposers, (list, tuple)):
        raise ValueError(f"proposers must be a list of host proposers (mtpc.decoding.drafts.proposers.HostProposer), got "
                         f"{proposers!r}")
    for proposer in proposers:
        methods = all(callable(getattr(proposer, m, None)) for m in ("start", "propose", "observe"))
        span = getattr(proposer, "span", None)
        if not methods or not hasattr(proposer, "name") or not hasattr(proposer, "widths"):
            raise ValueError(f"proposers: {proposer!r} is not a host proposer (name, widths, span, start, propose, "
                             "observe)")
        if isinstance(span, bool) or not isinstance(span, int) or not 1 <= span <= MAX_PROPOSER_SPAN:
            raise ValueError(f"proposers: {proposer!r} has span {span!r}; a window's tokens are an integer in "
                             f"1..{MAX_PROPOSER_SPAN:,}")
    return proposers


def checked_draft_temperature(value: float | None) -> float | None:
    """None (the target's own temperature) or a temperature a draft head can sample at (`mtpc.sampling`'s
    rule, the one every command applies)."""
    if value is not None:
        try:
            check_draft_temperature(value)
        except ValueError as e:
            raise ValueError(f"draft_{e}") from None
    return value


def refuse_batch(verifier: Verifier, span: int, B: int, T: int, max_new_tokens: int, device: torch.device,
                 generator) -> None:
    """Refuse a batch of a model without a family adapter, one generator per row of the wrong count, or
    caches (those `verifier` allocates for it) and cycle tensors that would not fit in the device's
    available memory."""
    backbone = verifier.backbone
    if B > 1:
        backbone.require_slot_caches(f"a batch of {B} prompts", "decode its prompts one at a time, or pass family=LlamaFamily() if its decoder follows the Llama layout")
    if isinstance(generator, (list, tuple)) and len(generator) != B:
        raise ValueError(f"generator: a list of generators needs one per row, got {len(generator)} for {B} rows")
    check_memory(batch_bytes(verifier, span, B, T, max_new_tokens), available_memory(device), f"a batch of {B} prompts",
                 "its caches and cycle tensors", "use a smaller batch, fewer new tokens or a smaller max_context")


def announce_compile(verifier: Verifier, seconds: float, variants: int) -> None:
    """One line when a generation compiled (or loaded) step variants (`variants` > 0): how long, for which
    caches, what they take, and whether a later generation will compile again."""
    if not variants:
        return
    later = ("later generations in this process reuse it" if verifier.reserve else
             "a later generation needing more room compiles again (max_context sets the room)")
    log.warning("mtpc: compiled decoding cycle ready in %.1f s (%d step variant%s, traced or loaded from the step "
                "store), for caches of %s positions (%.0f MiB); %s", seconds, variants, "" if variants == 1 else "s",
                f"{verifier.max_len:,}", verifier.cache_bytes() / 2**20, later)


def verify_identity(decoder: SpeculativeDecoder, variant: VerifyVariant, layout: tuple) -> str | None:
    """What a compiled variant of the verify step depends on besides the tensors its guards check (see
    `precompiled_step`), derived (`derived_identity`) from what it closes over: the model and its family, the
    window layout (a tree's depth), the draft path's layers and the caches' length; not the head or the
    acceptance, so decoders of one model and layout share it. None for code outside mtpc, transformers and
    peft (a user's model family, a model's remote code)."""
    settings = decoder.settings
    return derived_identity(variant, layout, decoder.backbone.model, decoder.backbone.family, settings.layout,
                            settings.lora_layers, decoder.verifier.max_len)


def step_identity(decoder: SpeculativeDecoder, variant: StepVariant, layout: tuple) -> str | None:
    """What a compiled variant of the acceptance-and-draft step depends on besides the tensors its guards check,
    derived from what it closes over: the decoder's `CycleSettings` whole, the model, its family and the head
    (their configurations), the caches' length. None for code outside mtpc, transformers and peft (a user's
    acceptance rule or model family, a model's remote code), whose changes a stored step would not notice."""
    return derived_identity(variant, layout, decoder.settings, decoder.backbone.model, decoder.backbone.family,
                            decoder.head, decoder.verifier.max_len)


def decide_savable(decoder: SpeculativeDecoder, variant: StepVariant) -> bool:
    """Whether torch can save a decide step: not one that drafts under `torch.func.vmap` (a tree's draft, a
    batch's), whose pytree flattening puts a guard on pytree's registry that torch 2.13 cannot serialize; such
    a step is compiled for its process straight away (an attempt traced the SmolLM2 tree's step twice)."""
    return decoder.layout.tree is None and variant.batch == 1


def batch_bytes(verifier: Verifier, span: int, B: int, T: int, max_new_tokens: int) -> int:
    """About the memory a batch takes: the caches `verifier` allocates for it (as many slots as it will:
    `max_context` ones at least; none when it reuses its own), the prefill's activations and a cycle's
    logits and rows."""
    backbone = verifier.backbone
    element = backbone.parts.lm_head.weight.element_size()
    caches = verifier.new_cache_bytes(B, T, max_new_tokens + span)  # what `_start` asks `Verifier.start` for
    prefill = 16 * T * backbone.hidden_size * element
    cycle = 3 * span * backbone.vocab_size * 8  # logits, probabilities and proposal rows (float64)
    return caches + B * (prefill + cycle)


def cycle_draws(sampling: Sampling, generator, h: torch.Tensor, size: int) -> torch.Tensor | None:
    """`[B, size]` (`h` `[B, d]` gives the batch and device): every draw of a sampling cycle; greedy, none."""
    if sampling.greedy:
        return None
    return cycle_uniforms(h.shape[0], size, generator, h.device)


def _no_stamp(kind: str) -> None:
    """No phase clock: nothing to stamp."""
