"""Lossless self-speculative decoding with a circuit draft head (MtPC, Algorithm 2), and plain decoding.

One cycle, with the verifier's next-token target `p_0` carried over from the previous cycle (the
"re-used verifier state") and the draft hidden state `h` at the last committed token:

1. `theta = head(h)`; the circuit drafts a window `d_0 .. d_{n-1}`.
2. Position 0 is decided *before* any backbone call, against `p_0`: greedy takes `argmax p_0`;
   sampling accepts `d_0` with probability `min(1, p_0(d_0) / q(d_0))`, else draws the bonus token from
   `norm(max(0, p_0 - q_0))`. Either way one token `x_0` is committed; the bonus is kept only when
   the draft's first token was not accepted.
3. One backbone call on `[x_0, d_1 .. d_{w-1}]` (`w = min(n, tokens left)`) gives the verifier's
   targets `p_1 .. p_w` and the draft path's hidden states. Drafts `d_1 ..` are accepted left to
   right (greedy: equal to `argmax p_j`; sampling: the Leviathan/Chen rule against the proposal's
   exact conditionals `r_j`, from ratios of prefix marginals).
4. The caches are cropped to the committed tokens. The next cycle re-uses `p_a` at the last committed
   position and `h` there. After a rejection at position `j` the token there is *not* drawn now: the
   next cycle's target for that position is the residual `norm(max(0, p_j - r_j))`, so the
   deferred token is still exactly distributed (dropping the residual and re-drafting against `p_j`
   would bias the output towards the draft).

So every cycle makes exactly one backbone call and commits 1 .. n tokens; greedy output equals plain
greedy decoding, sampled output is exactly distributed as the verifier's (shaped) target.

`bonus=True` (bonus-conditioned drafting, the default): `x_0` is taken from `p_0` directly (argmax
or a sample) and the circuit drafts `d_1 ..` conditioned on it (exact conditionals of the same
circuit). It costs the same as `bonus=False` (one backbone call, one circuit program with or without
`x_0` given) and its drafts are conditioned on the token actually committed, so it accepts at least
as much: measured on the tiny LM (benchmarks/bench_bonus.py) equal for FF (whose drafts do not depend
on `x_0`) and up to 1.3x more tokens per cycle for CP in sampling mode. `bonus=False` keeps the
circuit's own first token when the verifier accepts it (steps 1-2 above).

Greedy draft strategies (`draft=`): `"conditional"` (sequential argmax of the circuit's exact
conditionals; default: it accepted most in our measurements), `"marginal"` (per-position marginal
argmax), `"map"` (the circuit's max-product MAP), `"sample"` (a circuit sample). Sampling mode always
drafts circuit samples.

Prompt lookup (`lookup=K` or a `mtpc.decoding.proposals.PromptLookup`; off by default): after `x_0`, a cycle may
draft the `K` tokens that followed the latest earlier occurrence of the text's last few tokens instead
of (or, when shorter than the window, before) the circuit's tokens. They are point-mass proposals:
accepted with probability `p(c)`, residual `p` without `c`, renormalised, the same `AcceptanceRule`
with `q = delta_c`; the choice of source reads only the past (`mtpc.decoding.proposals.LookupState.use`), so
greedy output still equals plain greedy and sampling stays exact. Proposal sources live in
`mtpc.decoding.proposals`; this module keeps the one loop, the targets and the acceptance rule.

Also usable from transformers: `model.generate(ids, custom_generate=decoder.custom_generate, ...)`
(transformers 5.x accepts a callable; see `SpeculativeDecoder.custom_generate`). Streaming: any
transformers `BaseStreamer` (`TextStreamer`, `TextIteratorStreamer`) as `generate(..., streamer=)`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable

import torch
from torch import nn

from ..heads import MTPHead
from .acceptance import AcceptanceRule, Target, draw, uniform
from .backbone import BackboneState, SplitBackbone, lora_depth
from .inputs import check_budget, check_eval, check_processors, check_prompt, eos_set
from .proposals import CircuitDrafter, Draft, LookupState, PromptLookup

__all__ = ["DecodeStats", "GenerateOutput", "SpeculativeDecoder", "generate_autoregressive", "DRAFT_STRATEGIES"]

DRAFT_STRATEGIES = ("conditional", "marginal", "map", "sample")


# --------------------------------------------------------------------------- outputs

@dataclass
class DecodeStats:
    """Per-generation measurements. `accepted_per_cycle[c]` = tokens committed by cycle `c` (1..n;
    the paper's accepted length), `draft_accepted_per_cycle[c]` = how many of them were the circuit's
    drafted tokens. Times exclude the prefill."""

    prefill_seconds: float = 0.0
    cycle_seconds: list[float] = field(default_factory=list)
    accepted_per_cycle: list[int] = field(default_factory=list)
    draft_accepted_per_cycle: list[int] = field(default_factory=list)
    lookup_cycles: int = 0  # cycles whose draft came from prompt lookup

    @property
    def cycles(self) -> int:
        return len(self.cycle_seconds)

    @property
    def new_tokens(self) -> int:
        return sum(self.accepted_per_cycle)

    @property
    def mean_accepted(self) -> float:
        return self.new_tokens / self.cycles if self.cycles else 0.0

    @property
    def mean_cycle_latency(self) -> float:
        return sum(self.cycle_seconds) / self.cycles if self.cycles else 0.0

    @property
    def tokens_per_second(self) -> float:
        total = sum(self.cycle_seconds)
        return self.new_tokens / total if total > 0 else 0.0

    def as_dict(self) -> dict:
        return {"cycles": self.cycles, "new_tokens": self.new_tokens, "mean_accepted": self.mean_accepted,
                "mean_cycle_latency": self.mean_cycle_latency, "tokens_per_second": self.tokens_per_second,
                "prefill_seconds": self.prefill_seconds, "accepted_per_cycle": list(self.accepted_per_cycle),
                "draft_accepted_per_cycle": list(self.draft_accepted_per_cycle), "lookup_cycles": self.lookup_cycles}


@dataclass
class GenerateOutput:
    sequences: torch.Tensor  # [1, prompt + new] long
    stats: DecodeStats


# --------------------------------------------------------------------------- the decoder

class SpeculativeDecoder:
    """Self-speculative decoding of `model` (verifier) with `head` drafting from the draft path.

    `lora_layers`: the last `k` layers run twice (see `SplitBackbone`). `draft`: greedy draft strategy
    (`DRAFT_STRATEGIES`). `bonus`: bonus-conditioned drafting (default). `acceptance`: the speculative-sampling
    rule (an `AcceptanceRule`; replace it only to study wrong rules). `lookup`: prompt-lookup drafting
    inside the same loop (`K` tokens per match, or a `PromptLookup`; off by default, see
    `mtpc.decoding.proposals`).
    """

    def __init__(self, model: nn.Module, head: MTPHead, lora_layers: int = 0, *, draft: str = "conditional",
                 bonus: bool = True, acceptance: AcceptanceRule | None = None, lookup: int | PromptLookup | None = None,
                 family=None):
        if draft not in DRAFT_STRATEGIES:
            raise ValueError(f"unknown draft strategy {draft!r}; choose one of {DRAFT_STRATEGIES}")
        self.backbone = SplitBackbone(model, lora_layers, family=family)
        if head.hidden_size != self.backbone.hidden_size:
            raise ValueError(f"the head was built for hidden size {head.hidden_size}, the model's is "
                             f"{self.backbone.hidden_size}")
        if head.num_states > self.backbone.vocab_size:
            raise ValueError(f"the head's circuit has {head.num_states} states (token ids 0..{head.num_states - 1}) "
                             f"but the model's vocabulary has only {self.backbone.vocab_size} tokens")
        self.head = head
        self.circuit = CircuitDrafter(head)
        self.draft, self.bonus = draft, bonus
        self.lookup = PromptLookup.of(lookup)
        self.acceptance = acceptance or AcceptanceRule()

    # ----------------------------------------------------------------- public API

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                 eos_token_id: int | Iterable[int] | None = None,
                 generator: torch.Generator | None = None, streamer=None) -> GenerateOutput:
        """Generate up to `max_new_tokens` tokens after `input_ids` (`[1, T]` or `[T]`), stopping after the
        first EOS. Greedy by default; `do_sample` samples the shaped target exactly.

        `streamer`: any transformers `BaseStreamer`, fed as transformers' own loops feed it: `put` the
        prompt `[1, T]`, then `put` each cycle's committed tokens `[1, k]` (as assisted decoding does),
        then `end()` once."""
        prompt = check_prompt(input_ids, self.backbone.vocab_size)
        check_budget(max_new_tokens)
        check_eval(self.backbone.model)
        target = Target(do_sample, temperature, top_k, top_p)
        eos = eos_set(eos_token_id)
        stats = DecodeStats()
        tokens = prompt[0].tolist()
        if streamer is not None:
            streamer.put(prompt.cpu())
        if max_new_tokens == 0:
            _end(streamer)
            return GenerateOutput(prompt.clone(), stats)

        start = time.perf_counter()
        state = self.backbone.new_state()
        out = self.backbone(prompt, state, keep=1)
        nxt = self._carry(target, out.logits[0, -1])
        h = out.hidden[0, -1]  # [d]
        lookup = None
        if self.lookup is not None:
            lookup = LookupState(self.lookup)
            lookup.extend(tokens)
        stats.prefill_seconds = time.perf_counter() - start

        left = max_new_tokens
        while left > 0:
            start = time.perf_counter()
            committed, from_draft, source, h, nxt = self._cycle(h, nxt, state, left, target, eos, generator, lookup)
            stats.cycle_seconds.append(time.perf_counter() - start)
            stats.accepted_per_cycle.append(len(committed))
            stats.draft_accepted_per_cycle.append(from_draft)
            stats.lookup_cycles += source == "lookup"
            tokens += committed
            left -= len(committed)
            if streamer is not None:
                streamer.put(torch.tensor([committed], dtype=torch.long))
            if committed[-1] in eos:
                break
        _end(streamer)
        return GenerateOutput(torch.tensor([tokens], dtype=torch.long, device=prompt.device), stats)

    # ----------------------------------------------------------------- one cycle

    @staticmethod
    def _carry(target: Target, logits: torch.Tensor) -> torch.Tensor:
        """What the next cycle verifies its first token against: logits (greedy) or probabilities."""
        return target.probs(logits) if target.do_sample else logits

    def _cycle(self, h, first, state: BackboneState, left: int, target: Target, eos: set[int], generator,
               lookup: LookupState | None):
        """Draft, decide x_0, one backbone call, accept. Returns (committed ids, how many came from the
        draft, the draft's source, next h `[d]`, next target `[V]`)."""
        theta = self.head(h.to(self.head.dtype))[None]  # [1, P]
        draft = self._draft(theta, first, target, generator, lookup)
        x0 = int(draft.window[0])
        if left == 1 or x0 in eos:  # nothing left to verify: no backbone call
            return [x0], int(draft.from_draft), draft.source, h, first
        w = min(draft.window.numel(), left)
        base = state.length
        out = self.backbone(draft.window[None, :w], state)  # logits [1, w, V], hidden [1, w, d]
        logits = out.logits[0]
        a, carried = 1, None
        while a < w and int(draft.window[a - 1]) not in eos:
            ok, carried = self._verify(theta, draft, a, logits[a - 1], target, generator)
            if not ok:
                break
            a += 1
        self.backbone.crop(state, base + a)
        nxt = carried if carried is not None else self._carry(target, logits[a - 1])
        committed = draft.window[:a].tolist()
        if lookup is not None:
            if draft.source == "circuit":
                lookup.record_circuit(a - 1)
            lookup.extend(committed[1:])  # x_0 was added when drafting
        return committed, int(draft.from_draft) + a - 1, draft.source, out.hidden[0, a - 1], nxt

    def _draft(self, theta, first, target: Target, generator, lookup: LookupState | None) -> Draft:
        """The window and its proposal; decides x_0 against `first` (see the module docstring), then
        drafts the rest from the circuit or, when `lookup` chooses it, from prompt lookup."""
        x0, own = self._first_token(first, theta, target, generator)
        if lookup is not None:
            lookup.extend([x0])
            proposal = lookup.propose()
            if proposal is not None and lookup.use(proposal):
                tokens = proposal.tokens[:lookup.length(proposal, self.circuit.n)]
                return self._lookup_draft(theta, x0, tokens, target, generator, own is not None and own.from_draft)
        return own if own is not None else self._circuit_draft(theta, x0, target, generator)

    def _first_token(self, first, theta, target: Target, generator) -> tuple[int, Draft | None]:
        """x_0. Bonus-conditioned drafting takes it from `first` directly (argmax or a draw) and drafts
        afterwards; otherwise the circuit drafts first and x_0 is its own first token when the verifier
        accepts it, so the circuit's whole window comes back with it."""
        if self.bonus:
            return (draw(first, generator) if target.do_sample else int(first.argmax())), None
        own = self._unconditioned_draft(theta, first, target, generator)
        return int(own.window[0]), own

    def _circuit_draft(self, theta, x0: int, target: Target, generator) -> Draft:
        """The circuit's window after a committed x_0, conditioned on it (bonus-conditioned drafting)."""
        c = self.circuit
        keep0 = x0 < c.v
        given = [x0] if keep0 else []
        if not target.do_sample:
            d = c.greedy(theta, self.draft, generator, given)
            return Draft(torch.cat([d.new_tensor([x0]), d[1:]]), d, True, False)
        if keep0 and c.program is not None:  # x_1.. drawn from q(. | x_0) with their conditionals
            d, rows = c.program.sample(theta[0], generator, theta.new_tensor(given, dtype=torch.long))
            return Draft(d, d, True, False, rows=rows)
        d = c.sample(theta, generator, given)
        window = torch.cat([d.new_tensor([x0]), d[1:]])
        cond = window if keep0 else d
        return Draft(window, cond, keep0, False, c.log_r(theta, cond, keep0))

    def _unconditioned_draft(self, theta, first, target: Target, generator) -> Draft:
        """The circuit's own window; x_0 is its first token if the verifier accepts it (greedy: equal to
        the argmax; sampling: the speculative rule against `first`), else the verifier's."""
        c = self.circuit
        if not target.do_sample:
            x0 = int(first.argmax())
            d = c.greedy(theta, self.draft, generator, [])
            return Draft(torch.cat([d.new_tensor([x0]), d[1:]]), d, True, from_draft=int(d[0]) == x0)
        if c.program is not None:
            d, rows = c.program.sample(theta[0], generator)
            d0 = int(d[0])
            if self.acceptance.accept(float(first[d0]), float(rows[0, d0]), uniform(generator)):
                return Draft(d, d, True, True, rows=rows)
            x0 = draw(self.acceptance.residual(first, self._padded_probs(rows[0], first)), generator)
            return Draft(torch.cat([d.new_tensor([x0]), d[1:]]), d, True, False, rows=rows)
        d = c.sample(theta, generator, [])
        log_r = c.log_r(theta, d, True)
        d0 = int(d[0])
        if self.acceptance.accept(float(first[d0]), float(log_r[0].exp()), uniform(generator)):
            return Draft(d, d, True, True, log_r)
        q0 = self._padded(c.conditional(theta, d, 0, True, 0), first)
        x0 = draw(self.acceptance.residual(first, q0), generator)
        window = torch.cat([d.new_tensor([x0]), d[1:]])
        return Draft(window, d, True, False, log_r)

    def _lookup_draft(self, theta, x0: int, tokens: list[int], target: Target, generator, from_draft: bool) -> Draft:
        """`[x_0, lookup tokens]` (point-mass proposals), then, when that is shorter than the circuit's
        window, the circuit's draft conditioned on all of them."""
        c = self.circuit
        given = [x0] + tokens
        device = theta.device
        if len(given) >= c.n or max(given) >= c.v:  # no room for the circuit, or a token it cannot observe
            window = torch.tensor(given, dtype=torch.long, device=device)
            return Draft(window, window, True, from_draft, point_mass=len(tokens), source="lookup")
        if not target.do_sample:
            d = c.greedy(theta, self.draft, generator, given)
            return Draft(d, d, True, from_draft, point_mass=len(tokens), source="lookup")
        if c.program is not None:
            d, rows = c.program.sample(theta[0], generator, torch.tensor(given, dtype=torch.long, device=device))
            return Draft(d, d, True, from_draft, rows=rows, point_mass=len(tokens), source="lookup")
        d = c.sample(theta, generator, given)
        return Draft(d, d, True, from_draft, c.log_r(theta, d, True), point_mass=len(tokens), source="lookup")

    def _verify(self, theta, draft: Draft, j: int, logits_j, target: Target, generator):
        """Accept draft.window[j] against the verifier's logits for that position.
        Returns (accepted, the carried target after a rejection or None)."""
        token = int(draft.window[j])
        if not target.do_sample:
            return token == int(logits_j.argmax()), None
        p = target.probs(logits_j)  # [V]
        if self.acceptance.accept(float(p[token]), draft.q(j), uniform(generator)):
            return True, None
        if j <= draft.point_mass:  # a lookup token: q = delta_token, residual = p without it, renormalised
            r = torch.zeros_like(p)
            r[token] = 1
        elif draft.rows is not None:
            r = self._padded_probs(draft.rows[j], p)
        else:
            r = self._padded(self.circuit.conditional(theta, draft.cond, j, draft.keep0, j), p)
        return False, self.acceptance.residual(p, r)

    @staticmethod
    def _padded_probs(q: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """`[v]` probabilities over circuit states -> `[V]` (0 beyond v), in `like`'s dtype."""
        out = torch.zeros_like(like)
        out[: q.shape[0]] = q.to(like.dtype)
        return out

    @staticmethod
    def _padded(log_q: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """`[v]` log-probabilities over circuit states -> `[V]` probabilities (0 beyond v)."""
        q = torch.zeros_like(like)
        q[: log_q.shape[0]] = log_q.exp().to(like.dtype)
        return q

    # ----------------------------------------------------------------- transformers integration

    def custom_generate(self, model, input_ids, logits_processor=None, stopping_criteria=None,
                        generation_config=None, mtpc_streamer=None, **model_kwargs):
        """`model.generate(input_ids, custom_generate=decoder.custom_generate, max_new_tokens=..., ...)`.

        Streaming: pass the streamer as `mtpc_streamer=...` (it gets the prompt, each cycle's tokens and
        `end()`, as in `generate`). transformers 5.x hands a callable `custom_generate` only the keyword
        arguments its own `_sample` lacks, so a plain `streamer=` would receive the prompt from
        transformers and nothing after it.

        transformers 5.x prepares the generation config (max length, do_sample, temperature, top_k,
        top_p, eos) and calls this as the decoding loop; we read those settings and run `generate`.
        Other logits processors or stopping criteria are refused (they would change the target). Returns
        the sequences `[1, prompt + new]` (a `GenerateDecoderOnlyOutput` with `return_dict_in_generate`);
        use `decoder.generate` for the stats.
        """
        if model is not self.backbone.base and model is not self.backbone.model:
            raise ValueError("custom_generate belongs to a SpeculativeDecoder built for another model")
        mask = model_kwargs.get("attention_mask")
        if mask is not None and not bool((mask == 1).all()):
            raise ValueError("padded input is not supported: speculative decoding runs at batch size 1")
        check_processors(logits_processor, stopping_criteria)
        cfg = generation_config
        top_k = cfg.top_k if cfg.do_sample else None
        top_p = cfg.top_p if cfg.do_sample else None
        out = self.generate(input_ids, max_new_tokens=cfg.max_length - input_ids.shape[-1], do_sample=bool(cfg.do_sample),
                            temperature=cfg.temperature if cfg.do_sample and cfg.temperature is not None else 1.0,
                            top_k=top_k, top_p=top_p, eos_token_id=cfg.eos_token_id, streamer=mtpc_streamer)
        if cfg.return_dict_in_generate:
            from transformers.generation.utils import GenerateDecoderOnlyOutput

            return GenerateDecoderOnlyOutput(sequences=out.sequences)
        return out.sequences


# --------------------------------------------------------------------------- plain decoding

@torch.no_grad()
def generate_autoregressive(model: nn.Module, input_ids: torch.Tensor, max_new_tokens: int, do_sample: bool = False,
                            temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                            eos_token_id: int | Iterable[int] | None = None,
                            generator: torch.Generator | None = None, streamer=None) -> GenerateOutput:
    """Plain one-token-per-step decoding of the verifier (a PeftModel runs with adapters disabled), for
    comparison; same targets, same stats (one token per cycle), same `streamer` protocol (one token
    `[1]` per step, as transformers' greedy/sampling loop puts it)."""
    backbone = SplitBackbone(model, lora_depth(model))
    prompt = check_prompt(input_ids, backbone.vocab_size)
    check_budget(max_new_tokens)
    target = Target(do_sample, temperature, top_k, top_p)
    eos = eos_set(eos_token_id)
    check_eval(backbone.model)
    stats, tokens = DecodeStats(), prompt[0].tolist()
    if streamer is not None:
        streamer.put(prompt.cpu())
    state = backbone.new_state(draft=False)
    start = time.perf_counter()
    logits = backbone(prompt, state, keep=1).logits[0, -1]  # [V]
    stats.prefill_seconds = time.perf_counter() - start
    for step in range(max_new_tokens):
        start = time.perf_counter()
        token = target.pick(logits, generator)
        tokens.append(token)
        if streamer is not None:
            streamer.put(torch.tensor([token], dtype=torch.long))
        done = token in eos or step == max_new_tokens - 1
        if not done:
            logits = backbone(prompt.new_tensor([[token]]), state).logits[0, -1]
        stats.cycle_seconds.append(time.perf_counter() - start)
        stats.accepted_per_cycle.append(1)
        stats.draft_accepted_per_cycle.append(0)
        if done:
            break
    _end(streamer)
    return GenerateOutput(torch.tensor([tokens], dtype=torch.long, device=prompt.device), stats)


def _end(streamer) -> None:
    if streamer is not None:
        streamer.end()


