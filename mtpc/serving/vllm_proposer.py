"""An mtpc head drafting inside vLLM: `CircuitHeadProposer`, vLLM's out-of-tree (`custom_class`) proposer.

vLLM builds it as `CircuitHeadProposer(vllm_config)` in its model runner (the settings come from
`vllm_config.additional_config["mtpc"]`, which `mtpc.vllm_options` writes), hands it the target model once
(`load_model(model)`), and after every step asks `propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)`
for each request's draft, a list of token ids that its next step verifies (an empty list: no draft).

`propose` gets token ids only, so the hidden states come from a forward hook on the target model
(`HiddenCapture`): the model's output (the final norm's, `[T, d]`, one row per scheduled token), the rows'
`positions` and the attention metadata's `query_start_loc` (where each request's rows start). The hook is on the
top-level model, whose forward runs eagerly even when vLLM compiles the decoder inside it. The row a draft starts
from is the one whose logits gave the request's last sampled token `x_0`: the row at position
`num_tokens_no_spec - 2` (a prefill's last prompt row; after a verify, the row of the last accepted draft). It is
found by position, not by offset, and a step whose rows do not hold that position is an error, never a draft
from another row. From that hidden state (in float32) and `x_0` the head drafts exactly what mtpc's own decoder
drafts there (`Drafter.circuit_window`: the greedy window of the circuit's exact conditionals after `x_0`, an
`x_0` without a state summed out), for every request of the batch in one head call.

With prompt lookup (`lookup=K`), each request keeps mtpc's own `LookupState` (its n-gram index and the running
acceptance of both sources), found again from step to step by its text (vLLM's rows move when requests come and
go); a match replaces the circuit's draft when `LookupState.use` prefers it, and the circuit fills the positions
after it (`Drafter.lookup_window`), as `mtpc.decoding.drafts.proposers.LookupProposer` does.

At its start the proposer repairs vLLM 0.32's CPU rejection sampler where it is broken
(`mtpc.serving.vllm_repairs`: without the repair no speculative sampling above temperature 0 is lossless there).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from ..decoding.drafts.drafting import Drafter
from ..decoding.drafts.proposals import LookupState, PromptLookup
from ..errors import InputError, MtpcError
from ..sampling import GREEDY
from .options import (ProposerSettings, check_architecture, check_head_fits, check_vllm_version, checked_head,
                      draft_tokens)
from .vllm_repairs import repair_cpu_rejection_sampler

__all__ = ["CircuitHeadProposer", "HiddenCapture", "RequestTexts"]

LOGGER = logging.getLogger(__name__)


@dataclass
class Forward:
    """One forward of the target: `hidden` `[T, d]` (the model's output rows, the final norm's), `positions` `[T]`
    long (each row's position in its request's text), `starts` `[R + 1]` (request `i`'s rows are
    `starts[i] .. starts[i + 1] - 1`)."""

    hidden: torch.Tensor
    positions: torch.Tensor
    starts: list[int]

    def rows(self, requests: list[int], wanted: list[int]) -> torch.Tensor:
        """`[len(requests)]` long: the row of each request at the given position; an `MtpcError` when a request's
        rows do not hold it (the capture saw another step than the one proposed for)."""
        if len(self.starts) - 1 < max(requests) + 1:
            raise MtpcError(f"the captured forward holds {len(self.starts) - 1} requests; vLLM proposes for request "
                            f"{max(requests)}: the hidden states are not this step's")
        firsts = self.positions[torch.tensor([self.starts[i] for i in requests])].tolist()
        rows = []
        for i, position, first in zip(requests, wanted, firsts):
            offset = position - first
            if not 0 <= offset < self.starts[i + 1] - self.starts[i]:
                raise MtpcError(f"request {i}'s rows of the captured forward start at position {first} and hold "
                                f"{self.starts[i + 1] - self.starts[i]}; its last token came from position "
                                f"{position}: the hidden states are not this step's")
            rows.append(self.starts[i] + offset)
        rows = torch.tensor(rows)
        if self.positions[rows].tolist() != wanted:  # positions run consecutively within a request's rows
            raise MtpcError("the captured rows' positions are not consecutive within a request: no row to draft from")
        return rows


class HiddenCapture:
    """A forward hook on the target model keeping its last forward (`Forward`) until `take` reads it once."""

    def __init__(self, hidden_size: int):
        self.hidden_size = hidden_size
        self.last: Forward | None = None
        self.handle = self.context = None

    def attach(self, model: torch.nn.Module) -> None:
        from vllm import forward_context

        self.context = forward_context  # where vLLM keeps the running forward's attention metadata
        self.handle = model.register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs, output) -> None:
        context = self.context
        metadata = context.get_forward_context().attn_metadata if context.is_forward_context_available() else None
        if metadata is None:  # a profiling run: no requests
            self.last = None
            return
        if not isinstance(metadata, dict) or not metadata:
            raise MtpcError(f"vLLM split this forward into micro-batches ({type(metadata).__name__} of attention "
                            "metadata); mtpc's proposer reads one batch: run without ubatching")
        positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
        if not isinstance(output, torch.Tensor) or output.dim() != 2 or output.shape[1] != self.hidden_size:
            raise MtpcError(f"the model's forward returned {type(output).__name__} "
                            f"{tuple(getattr(output, 'shape', ()))}, not the final hidden states [tokens, "
                            f"{self.hidden_size}]: a layout mtpc's proposer does not know")
        if not isinstance(positions, torch.Tensor) or positions.dim() != 1:
            raise MtpcError("the model's forward took no positions of one dimension (multimodal rotary positions?): "
                            "a layout mtpc's proposer does not know")
        starts = next(iter(metadata.values())).query_start_loc
        # positions and starts are views of buffers the next step refills: copied (a few ints); the hidden
        # states are the forward's output, read before the next forward runs
        self.last = Forward(output, positions.detach().to("cpu", copy=True), starts.tolist())

    def take(self) -> Forward:
        forward, self.last = self.last, None
        if forward is None:
            raise MtpcError("vLLM asked for drafts, but no forward of the target was captured since the last ones "
                            "(a CUDA graph replayed without running the model's forward? use cudagraph_mode "
                            "PIECEWISE or NONE)")
        return forward


@dataclass
class Tracked:
    """One request's prompt lookup: mtpc's `LookupState` and whether its last draft was the circuit's."""

    state: LookupState
    circuit: bool = False


KEY_TOKENS = 8  # the last tokens of a text that, with its length, find its request again


class RequestTexts:
    """Each request's `Tracked` lookup, found again step after step by its text: vLLM passes rows, not request
    ids, and a row moves when requests before it finish. A request's text last step is its text now less the
    tokens just sampled; one found nowhere (a new request, a preempted one) starts afresh."""

    def __init__(self, config: PromptLookup):
        self.config = config
        self.previous: dict[tuple, list[Tracked]] = {}

    def follow(self, requests: list[int], sampled: list[list[int]], num_tokens, token_ids) -> list[Tracked]:
        current: dict[tuple, list[Tracked]] = {}
        found = []
        for i in requests:
            length, added = int(num_tokens[i]), len(sampled[i])
            text = token_ids[i, :length]
            tracked = self._claim(text, length - added)
            if tracked is None:
                tracked = Tracked(LookupState(self.config))
                tracked.state.extend(text.tolist())
            else:
                if tracked.circuit:  # the circuit's running acceptance: its drafted tokens kept, x_0 aside
                    tracked.state.record_circuit(added - 1)
                tracked.state.extend(text[length - added:].tolist())
            current.setdefault(self._key(text, length), []).append(tracked)
            found.append(tracked)
        self.previous = current
        return found

    @staticmethod
    def _key(text: np.ndarray, length: int) -> tuple:
        return length, tuple(text[max(0, length - KEY_TOKENS):length].tolist())

    def _claim(self, text: np.ndarray, known: int) -> Tracked | None:
        candidates = self.previous.get(self._key(text, known), [])
        for j, tracked in enumerate(candidates):
            if np.array_equal(np.asarray(tracked.state.text), text[:known]):
                return candidates.pop(j)
        return None


class CircuitHeadProposer:
    """vLLM's proposer for an mtpc head (see the module docstring). Built by vLLM with its `VllmConfig`; the head
    folder and options come from `vllm_config.additional_config["mtpc"]` (`mtpc.vllm_options` writes them)."""

    def __init__(self, vllm_config):
        import vllm

        check_vllm_version(vllm.__version__)
        if repair_cpu_rejection_sampler():  # in this worker, where the rejection sampler runs
            LOGGER.warning("mtpc: repaired vLLM's CPU rejection sampler (its temperatures were never written: "
                           "sampling with drafts was not lossless; see mtpc.serving.vllm_repairs)")
        self.settings = ProposerSettings.from_additional_config(vllm_config.additional_config)
        model_config = vllm_config.model_config
        self.head = checked_head(self.settings.head)
        check_head_fits(self.head, model_config.get_hidden_size(), model_config.get_vocab_size(),
                        str(model_config.model))
        self.tied = self.head.parameterisation == "tied"
        if self.tied and vllm_config.parallel_config.tensor_parallel_size > 1:
            raise InputError("a tied head reads the model's output layer, which tensor parallelism splits across "
                             "ranks: serve it with tensor_parallel_size=1, or use an untied head")
        self.n = self.head.num_variables
        self.lookup = PromptLookup.of(self.settings.lookup)
        self.tokens = min(vllm_config.speculative_config.num_speculative_tokens,
                          draft_tokens(self.n, self.settings.lookup, None))
        self.max_len = model_config.max_model_len
        self.vocab_size = model_config.get_vocab_size()
        self.capture = HiddenCapture(self.head.hidden_size)
        self.texts = RequestTexts(self.lookup) if self.lookup is not None else None
        self.drafter: Drafter | None = None
        self.recorded: deque = deque(maxlen=self.settings.record_drafts or None)
        self.counts = {"calls": 0, "seconds": 0.0, "requests": 0, "drafted": 0, "lookup_windows": 0}

    # ----------------------------------------------------------------- vLLM's calls

    def load_model(self, model: torch.nn.Module) -> None:
        """The target model: its layout checked, the head moved to its device in float32 (a tied head reads its
        output layer, referenced), and the hidden-state hook attached."""
        check_architecture(type(model).__name__)
        device = next(model.parameters()).device
        self.head = self.head.to(device=device, dtype=torch.float32).eval()
        if self.tied:
            self.head.tie_to(model.lm_head)
        span = max(self.n, 1 + (self.lookup.tokens if self.lookup else 0))
        self.drafter = Drafter(self.head, (self.n,), None, span, self.vocab_size)
        self.capture.attach(model)

    @torch.inference_mode()
    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec, token_ids_cpu,
                slot_mappings=None) -> list[list[int]]:
        """Each request's draft after its last sampled token (`[]` for a request that sampled none this step, or
        whose text fills the model's context)."""
        start = time.perf_counter()
        forward = self.capture.take()
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        live = [i for i, s in enumerate(sampled_token_ids) if s and num_tokens_no_spec[i] < self.max_len]
        if live:
            positions = [int(num_tokens_no_spec[i]) - 2 for i in live]  # the rows that gave each x_0
            hidden = forward.hidden[forward.rows(live, positions).to(forward.hidden.device)].float()  # [R, d]
            first = [sampled_token_ids[i][-1] for i in live]
            chosen = self._lookups(live, sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
            for j, draft in enumerate(self._drafts(hidden, first, chosen)):
                i = live[j]
                drafts[i] = draft[:min(self.tokens, self.max_len - int(num_tokens_no_spec[i]))]  # within the context
                self._record(token_ids_cpu[i, :int(num_tokens_no_spec[i])], hidden[j], drafts[i], chosen[j] is not None)
        self._count(start, live, drafts)
        return drafts

    def _drafts(self, hidden: torch.Tensor, first: list[int], chosen: list[list[int] | None]) -> list[list[int]]:
        """Per row (`hidden` `[R, d]`, its `x_0`): the circuit's greedy window after `x_0` (all such rows in one head
        call), or where prompt lookup chose tokens, them and the circuit's fill after them."""
        drafts: list[list[int]] = [[] for _ in first]
        by_circuit = [j for j, tokens in enumerate(chosen) if tokens is None]
        if by_circuit:
            x0 = torch.tensor([first[j] for j in by_circuit], device=hidden.device)  # [C]
            window = self.drafter.circuit_window(hidden[by_circuit], x0, GREEDY)  # tokens [C, span], x_0 first
            for j, tokens in zip(by_circuit, window.tokens[:, 1:self.n].tolist()):
                drafts[j] = tokens
        for j, tokens in enumerate(chosen):
            if tokens is not None:
                drafts[j] = self._lookup_draft(hidden[j], first[j], tokens)
        return drafts

    # ----------------------------------------------------------------- what callers may read

    def stats(self) -> dict:
        """Calls, seconds in `propose`, requests drafted for, tokens drafted, lookup windows; since the start."""
        return dict(self.counts)

    def recorded_drafts(self) -> list[dict]:
        """The last `record_drafts` drafts: `text` (the request's tokens, `x_0` last), `hidden` (the hidden state
        drafted from, float32), `draft`, `lookup` (whether prompt lookup proposed it)."""
        return list(self.recorded)

    # ----------------------------------------------------------------- helpers

    def _lookups(self, live, sampled, num_tokens, token_ids) -> list[list[int] | None]:
        """Per live request, the lookup tokens that replace the circuit's draft this step, or None (mtpc's
        `LookupProposer` rule: a match, preferred by `LookupState.use`, as long as `LookupState.length` says)."""
        if self.texts is None:
            return [None] * len(live)
        chosen = []
        for tracked in self.texts.follow(live, sampled, num_tokens, token_ids):
            proposal = tracked.state.propose()
            use = proposal is not None and tracked.state.use(proposal)
            tracked.circuit = not use
            chosen.append(proposal.tokens[:tracked.state.length(proposal, self.n)] if use else None)
        self.counts["lookup_windows"] += sum(tokens is not None for tokens in chosen)
        return chosen

    def _lookup_draft(self, hidden: torch.Tensor, first: int, tokens: list[int]) -> list[int]:
        """The lookup tokens, then the circuit's draft after them up to its `n` positions."""
        length = self.drafter.lookup_length(tokens)
        window = self.drafter.lookup_window(hidden, first, tokens, length, GREEDY)
        return window.tokens[1:length].tolist()

    def _record(self, text: np.ndarray, hidden: torch.Tensor, draft: list[int], lookup: bool) -> None:
        if self.settings.record_drafts:
            self.recorded.append({"text": text.tolist(), "hidden": hidden.cpu().tolist(), "draft": list(draft),
                                  "lookup": lookup})

    def _count(self, start: float, live: list[int], drafts: list[list[int]]) -> None:
        counts = self.counts
        counts["calls"] += 1
        counts["seconds"] += time.perf_counter() - start
        counts["requests"] += len(live)
        counts["drafted"] += sum(len(d) for d in drafts)
