"""MTP draft heads: hidden states of an LM become the flat parameters of any compiled circuit.

`head = MTPHead(circ, hidden_size, parameterisation=...)` maps `h` `[..., d]` to the circuit's flat
logits `theta` `[..., P]` (the runtime contract's layout: all input slots, leaf by leaf `[v]` rows,
then all sum slots). Every parameterisation has the same contract (`forward`, the split views
`input_logits(h, leaves)` / `sum_logits(h)` the training loss uses, `dtype`, save/load); every sum
slot gets a projection `R` `[S, d]` plus a bias to its `[U, K]` logits. They differ in the input
units (leaves; `n` positions, `Q` leaves, `v` states, `d` hidden size):

- `"full"` (the paper's): every leaf `q` has its own unembedding `W_q` `[v, d]` (together
  `W ∈ R^{n×r×v×d}`). All of it is one matrix `[P, d]` plus a bias `[P]`, so `head(h)` is one matmul.
- `"shared"` (paper Appendix G): one unembedding `E_i` `[v, d]` per window position, plus a low-rank
  per-leaf adapter: `logits_q = E_i h + c_i + B_q (A_q h + a_q)` with `A_q` `[a, d]`, `B_q` `[v, a]`
  (`a = adapter_rank`), `B` zero at initialisation. `E`, `A` and `R` are stacked in one matrix, so a
  cycle is one matmul `[n*v + Q*a + S, d]` and one batched product `[1, a] @ [a, v]` per leaf that
  also adds the position's logits (`B` is stored transposed, `[Q, a, v]`: 9x faster than `[Q, v, a]`
  for this batch-1 product on CPU).
- `"factorised"` (large vocabularies): the per-position unembedding is itself low rank,
  `E_i = U_i V_i` (`V_i` `[k, d]`, `U_i` `[v, k]`, `k = factor_rank`), plus the same adapters:
  one matmul `[n*k + Q*a + S, d]`, then `[v, k]` and `[v, a]` batched products.

- `"tied"` (subword vocabularies): no unembedding of its own; every leaf reads the LM's own output
  layer `W` `[V, d]` (+ bias), *referenced, never copied or saved*, through a rank-`adapter_rank`
  adapter in hidden space: `logits_q = W[:v] (h + U_q (D_q h + e_q)) + b[:v]`. A head for a 152k-token
  LM costs `Q * a * 2d` weights (megabytes). `head.tie_to(lm.get_output_embeddings())` attaches the
  layer (the trainer, `load_head_entry` and `init_from` do it); a loaded head is untied until then.

Vocabulary mapping: by default circuit state `s` is token id `s`. A circuit with `v` states drafts token
ids `0 .. v-1` of an LM whose vocabulary may be larger (a byte circuit, v = 256, over a byte LM with a few
special tokens appended); `init_from` rows `0 .. v-1` initialise the units. With a *draft vocabulary*
(`vocabulary=[t_0, .., t_{v-1}]`: distinct token ids, e.g. the LM's `v` most frequent outputs) state
`s` is token `t_s` instead: the units read (and start from) those rows of the output layer, so a
circuit over a 49,152-token LM drafts over `v` = 1,024-8,192 states at that fraction of the cost.
`states_of(tokens)` maps token ids to states (a token outside the vocabulary to `v`: no state, an
invalid target) and `tokens_of(states)` back. Decoding stays exact: the verifier scores the whole
vocabulary and a token outside the draft vocabulary has draft probability 0.

Initialisation (`init_from` = the LM's output embedding `[V, d]`, or a list of `n`, one per window
position): every unit of position `i` starts as rows `0 .. v-1` of embedding `i` ("full", "shared";
"factorised" starts from its best rank-`k` approximation, exact when `k >= min(v, d)`) and the sum
projections start at zero (uniform mixtures), so at initialisation any circuit (CP, HMM, BTree, ...)
is exactly the fully factorised product of per-position softmaxes. For "shared"/"factorised" every
leaf of a position starts identical because the adapters' `B` is zero. Note for training: with
identical units and uniform sums every unit receives the same gradient in the "full" head, so the
symmetry never breaks by itself; `sum_init_std > 0` (random sum projections) breaks it while keeping
the FF distribution at initialisation exact (a mixture of identical components is that component).
(The adapters' distinct `A_q` break it too.) `identity_init = a` adds `a` to the diagonal of every
square sum block (`U == K`): HMM transitions start near the identity (paper Appendix H).

Precision: `head.to(torch.bfloat16)` stores and runs the weights in bf16 (about 2-4x faster
matrix-vector products on CPU); `theta` then comes out in bf16 and the circuit programs compute in
float32.

`head.save_pretrained(dir)` / `MTPHead.from_pretrained(dir)` (the same as `save_head(head, dir)` /
`load_head(dir)`): `head.safetensors` + `head.json` (format version, the circuit's graph spec inline,
the parameterisation and the head options); the round trip is exact in any dtype and returns the
saved subclass. A damaged folder raises `mtpc.errors.InputError` naming the file and the problem. The files
themselves (what they hold, how each is checked) are `mtpc.heads.storage`'s.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError, first_line
from ..files import inside
from ..lm.loading import readable_folder, safetensors_header
from .constants import DEFAULT_ADAPTER_RANK, DEFAULT_FACTOR_RANK, PARAMETERISATIONS
from .storage import (CONFIG_FILE, HEAD_FORMAT, MAX_VOCABULARY, WEIGHTS_FILE, check_memory, check_weights_header,
                      compute_dtype, head_arguments, read_head_config, read_head_weights, write_head_files)

__all__ = ["MTPHead", "FullHead", "SharedHead", "FactorisedHead", "TiedHead", "save_head", "load_head",
           "PARAMETERISATIONS", "HEAD_FORMAT"]



def _compiled(source):
    """The `CompiledCircuit` of any source `circuitc.compile` accepts without bindings (it keeps its graph)."""
    import circuitc

    return circuitc.compile(source)


class MTPHead(nn.Module, ABC):
    """Hidden states `[..., d]` -> flat circuit logits `[..., P]` (see the module docstring).

    `circ`: a `CompiledCircuit` (e.g. `circuitc.compile("x.pc", n=4)`), or a source `circuitc.compile`
    accepts without bindings (RegionGraph, graph-spec or plan dict, `.json`/`.plan.json`/`.pc` path or
    text); the head keeps the circuit's graph, so it can be saved. The circuit is a submodule, so
    `.to(device)` moves it too.

    `MTPHead(..., parameterisation=p)` builds the subclass for `p` (`FullHead`, `SharedHead`,
    `FactorisedHead`); `adapter_rank` ("shared", "factorised") and `factor_rank` ("factorised") size
    them and are ignored by the others.
    """

    parameterisation: str = ""

    def __new__(cls, *args, parameterisation: str = "full", **kwargs):
        if cls is MTPHead:
            if parameterisation not in _HEADS:
                raise ValueError(f"unknown head parameterisation {parameterisation!r}; known: {PARAMETERISATIONS}")
            cls = _HEADS[parameterisation]
        return super().__new__(cls)

    def __init__(self, circ, hidden_size: int, init_from: torch.Tensor | Sequence[torch.Tensor] | None = None, *,
                 parameterisation: str = "full", identity_init: float | None = None, sum_init_std: float = 0.0,
                 adapter_rank: int = DEFAULT_ADAPTER_RANK, factor_rank: int = DEFAULT_FACTOR_RANK,
                 first_token: bool = False, first_token_mlp: int = 0, dtype: torch.dtype | None = None,
                 vocabulary: Sequence[int] | torch.Tensor | None = None):
        super().__init__()
        if parameterisation != self.parameterisation:
            raise ValueError(f"{type(self).__name__} is the {self.parameterisation!r} parameterisation, "
                             f"not {parameterisation!r}")
        if not isinstance(circ, nn.Module):
            circ = _compiled(circ)
        self.circ = circ
        self.graph = getattr(circ, "graph", None)  # a CompiledCircuit keeps its checked RegionGraph
        self.hidden_size = int(hidden_size)
        self.options: dict[str, Any] = {"identity_init": identity_init, "sum_init_std": float(sum_init_std)}
        layout = circ.param_layout
        inputs = [s for s in layout if s.kind == "input"]
        self.num_states = inputs[0].shape[1]  # v
        self.num_variables = int(circ.leaf_variable.max()) + 1  # n
        self.num_leaves = int(circ.num_leaves)  # Q
        self.num_input_params = int(circ.num_input_params)
        self.num_params = int(circ.num_params)
        self.num_sum_params = self.num_params - self.num_input_params  # S
        self._set_vocabulary(vocabulary)
        self._build(dtype or torch.get_default_dtype(), adapter_rank=int(adapter_rank), factor_rank=int(factor_rank))
        self.first_embedding: nn.Parameter | None = None
        self.first_mlp_in: nn.Parameter | None = None
        self.first_mlp_out: nn.Parameter | None = None
        if first_token or first_token_mlp:
            self.read_first_token(first_token_mlp)
        if next(self.parameters()).device.type == "meta":
            # a head on the meta device is built for its sizes only (load_head's check): nothing to initialise
            # or tie, and torch's meta `normal_` would import dynamo (~1.3 s)
            return
        with torch.no_grad():
            self._init_inputs(init_from)
            self._init_sums(identity_init, sum_init_std)

    # ----------------------------------------------------------------- what a parameterisation defines

    @abstractmethod
    def _build(self, dtype: torch.dtype, adapter_rank: int, factor_rank: int) -> None:
        """Create the parameters (all zero)."""

    @abstractmethod
    def _init_inputs(self, init_from) -> None:
        """Initialise the input units from `init_from` (or randomly when None)."""

    @abstractmethod
    def _sum_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of the sum projection `[S, d]` and its bias `[S]`."""

    @abstractmethod
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """`[..., d]` -> `[..., P]`."""

    @abstractmethod
    def input_logits(self, h: torch.Tensor, leaves: slice | torch.Tensor = slice(None)) -> torch.Tensor:
        """`[..., d]` -> `[..., Q_chunk, v]` for the leaves selected by a slice or a LongTensor of leaf
        indices (leaf order as the circuit's)."""

    # ----------------------------------------------------------------- the draft vocabulary

    def _set_vocabulary(self, vocabulary) -> None:
        """`state_tokens` `[v]` (state -> token id) and `token_states` `[max id + 2]` (token id -> state,
        `v` for a token outside the vocabulary, the last entry standing for every larger id); buffers
        that move with the head and are not saved in its state dict (head.json lists the vocabulary)."""
        self.vocabulary: list[int] | None = None
        self.register_buffer("state_tokens", None, persistent=False)  # [v] long, or None
        self.register_buffer("token_states", None, persistent=False)  # [max id + 2] long, or None
        if vocabulary is None:
            return
        ids = torch.as_tensor(vocabulary, dtype=torch.long, device="cpu").flatten()  # [v] (a meta head too)
        v = self.num_states
        if ids.numel() != v:
            raise ValueError(f"the draft vocabulary lists {ids.numel()} tokens; the circuit has {v} states")
        if int(ids.min()) < 0 or int(ids.max()) >= MAX_VOCABULARY or ids.unique().numel() != v:
            raise ValueError(f"the draft vocabulary must list {v} distinct token ids in 0..{MAX_VOCABULARY - 1}")
        lookup = torch.full((int(ids.max()) + 2,), v, dtype=torch.long, device="cpu")  # [max id + 2]
        lookup[ids] = torch.arange(v, device="cpu")
        self.vocabulary = ids.tolist()
        self.state_tokens, self.token_states = ids, lookup

    def states_of(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids `[...]` -> the circuit's states `[...]` (a token without a state: `v`, or itself when
        the head has no draft vocabulary and the token is past `v`: never a valid state either way)."""
        if self.token_states is None:
            return tokens
        return self.token_states[tokens.clamp(0, self.token_states.shape[0] - 1)]

    def tokens_of(self, states: torch.Tensor) -> torch.Tensor:
        """The circuit's states `[...]` (each < v) -> token ids `[...]`."""
        return states if self.state_tokens is None else self.state_tokens[states]

    @property
    def max_token_id(self) -> int:
        """The largest token id the head drafts (the LM's vocabulary must hold it)."""
        return self.num_states - 1 if self.vocabulary is None else max(self.vocabulary)

    def vocabulary_rows(self, table: torch.Tensor) -> torch.Tensor:
        """The rows of a `[V, ...]` table (an output embedding) for the states `0 .. v-1`: `table[:v]`, or
        the draft vocabulary's rows."""
        if self.vocabulary is None:
            return table[: self.num_states]
        return table.index_select(0, self.state_tokens.to(table.device))

    # ----------------------------------------------------------------- the window's first token

    @property
    def reads_first_token(self) -> bool:
        """Whether the head's input carries the window's first token `x_0` (see `with_first_token`)."""
        return self.first_embedding is not None

    def read_first_token(self, mlp: int = 0) -> "MTPHead":
        """Give the head an embedding of the window's first token `x_0` `[v, d]`, added to its input
        (`with_first_token`), and with `mlp` > 0 a residual MLP of that width over the sum (`x_0` then
        selects among what `h` predicts non-linearly, not only by a shift). Both start at zero output,
        so a trained head keeps its distributions and training goes on from them. `x_0` is known before
        a window is drafted (the verifier chose it), and its embedding reaches every unit and mixture
        weight directly, not only through the circuit's `r`-state conditioning on it; the head then
        models the window after `x_0`, so the training losses leave `x_0`'s own term out
        (`first_given`). Idempotent; returns the head."""
        if not isinstance(mlp, int) or isinstance(mlp, bool) or mlp < 0:
            raise ValueError(f"the first token's MLP width must be a non-negative integer, got {mlp!r}")
        weight = next(self.parameters())
        d = self.hidden_size
        if self.first_embedding is None:
            self.first_embedding = nn.Parameter(torch.zeros(self.num_states, d, dtype=weight.dtype,
                                                            device=weight.device))  # [v, d]
            self.options["first_token"] = True
        if mlp and self.first_mlp_in is None:
            self.first_mlp_in = nn.Parameter(torch.empty(mlp, d, dtype=weight.dtype, device=weight.device))  # [m, d]
            if weight.device.type != "meta":
                nn.init.normal_(self.first_mlp_in, std=d ** -0.5)
            self.first_mlp_out = nn.Parameter(torch.zeros(d, mlp, dtype=weight.dtype, device=weight.device))  # [d, m]
            self.options["first_token_mlp"] = mlp
        elif mlp and self.first_mlp_in.shape[0] != mlp:
            raise ValueError(f"the head already reads x_0 through an MLP of width {self.first_mlp_in.shape[0]}, "
                             f"not {mlp}")
        return self

    def with_first_token(self, h: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        """The head's input: `h` `[..., d]`, plus the embedding of each window's first token `first` `[...]`
        long when the head reads it (a token past the circuit's `v` states reads the last state's row),
        plus the residual MLP of that sum when it has one."""
        if self.first_embedding is None:
            return h
        u = h + _as_dtype(self.first_embedding[first.clamp(0, self.num_states - 1)], h.dtype)  # [..., d]
        if self.first_mlp_in is None:
            return u
        hidden = F.silu(F.linear(u, _as_dtype(self.first_mlp_in, u.dtype)))  # [..., m]
        return u + F.linear(hidden, _as_dtype(self.first_mlp_out, u.dtype))  # [..., d]

    # ----------------------------------------------------------------- shared by all

    def sum_logits(self, h: torch.Tensor) -> torch.Tensor:
        """`[..., d]` -> `[..., P - num_input_params]`."""
        weight, bias = self._sum_rows()
        return F.linear(h, weight, bias)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the weights are stored (and the head runs) in."""
        return next(self.parameters()).dtype

    def num_weights(self) -> int:
        """The head's trainable parameter count."""
        return sum(p.numel() for p in self.parameters())

    @torch.no_grad()
    def _init_sums(self, identity_init, sum_init_std) -> None:
        weight, bias = self._sum_rows()  # [S, d], [S]
        if sum_init_std:
            nn.init.normal_(weight, std=sum_init_std)
        if identity_init:
            offset = self.num_input_params
            for slot in self.circ.param_layout:
                U, K = slot.shape
                if slot.kind == "sum" and U == K:
                    diag = slot.offset - offset + torch.arange(U) * (K + 1)
                    bias[diag] += identity_init

    def _positions(self, h: torch.Tensor) -> torch.Tensor:
        positions = self.circ.leaf_variable  # [Q]
        return positions if positions.device == h.device else positions.to(h.device)

    def config(self) -> dict[str, Any]:
        """What `load_head` needs to rebuild this head (the weights aside)."""
        if self.graph is None:
            raise ValueError("this head's circuit does not keep its RegionGraph, so it cannot be saved; build "
                             "the head from circuitc.compile(...) or a circuit that has `.graph`")
        return {
            "format": HEAD_FORMAT,
            "hidden_size": self.hidden_size,
            "parameterisation": self.parameterisation,
            "options": self.options,
            "dtype": str(self.dtype).removeprefix("torch."),
            "vocabulary": "circuit state s = token id s" if self.vocabulary is None else self.vocabulary,
            "graph": self.graph.to_json(),
        }

    # ----------------------------------------------------------------- Hugging Face conventions

    def save_pretrained(self, save_directory: str | Path) -> Path:
        """Write the head as `save_head` does (`head.safetensors` + `head.json`: graph spec,
        parameterisation, options, format version); `MTPHead.from_pretrained` reads it back."""
        return save_head(self, save_directory)

    @classmethod
    def from_pretrained(cls, pretrained_directory: str | Path, *, device: torch.device | str | None = None,
                        dtype: torch.dtype | None = None) -> "MTPHead":
        """The head saved in a folder (by `save_pretrained`, `save_head` or `mtpc train`), as its own
        subclass (`FullHead`, `SharedHead`, `FactorisedHead`); called on a subclass, the folder must hold
        that parameterisation. `dtype` casts it after loading (default: as saved)."""
        head = load_head(pretrained_directory, device=device)
        if not isinstance(head, cls):
            raise InputError(f"{pretrained_directory} holds a {head.parameterisation!r} head ({type(head).__name__}), "
                             f"not a {cls.__name__}")
        return head.to(dtype) if dtype is not None else head

    def extra_repr(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in self.options.items() if k.endswith("_rank") or k.startswith("first_token"))
        return (f"n={self.num_variables}, v={self.num_states}, leaves={self.num_leaves}, params={self.num_params}, "
                f"hidden_size={self.hidden_size}, parameterisation={self.parameterisation!r}{extra}")


class FullHead(MTPHead):
    """The paper's head: one `[P, d]` matrix `weight` and bias `bias`; leaf `q`'s rows are
    `weight[q*v:(q+1)*v]`, the sum projection the last `S` rows."""

    parameterisation = "full"

    def _build(self, dtype, adapter_rank, factor_rank) -> None:
        self.weight = nn.Parameter(torch.zeros(self.num_params, self.hidden_size, dtype=dtype))  # [P, d]
        self.bias = nn.Parameter(torch.zeros(self.num_params, dtype=dtype))  # [P]

    def _init_inputs(self, init_from) -> None:
        n, v, d, Q = self.num_variables, self.num_states, self.hidden_size, self.num_leaves
        leaf_rows = self.weight[: self.num_input_params].view(Q, v, d)  # [Q, v, d]
        if init_from is None:
            nn.init.normal_(leaf_rows, std=d ** -0.5)
        else:
            tables = _per_position(init_from, n, v, d, self)  # [n, v, d]
            leaf_rows.copy_(tables[self.circ.leaf_variable.cpu()].to(leaf_rows))

    def _sum_rows(self):
        return self.weight[self.num_input_params:], self.bias[self.num_input_params:]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """`[..., d]` -> `[..., P]`: one matmul."""
        return F.linear(h, self.weight, self.bias)

    def input_logits(self, h: torch.Tensor, leaves: slice | torch.Tensor = slice(None)) -> torch.Tensor:
        v = self.num_states
        rows_w = self.weight[: self.num_input_params].view(self.num_leaves, v, self.hidden_size)[leaves]
        rows_b = self.bias[: self.num_input_params].view(self.num_leaves, v)[leaves]
        out = F.linear(h, rows_w.reshape(-1, self.hidden_size), rows_b.reshape(-1))  # [..., Qc * v]
        return out.unflatten(-1, (-1, v))


class _AdapterHead(MTPHead):
    """Per-position logits `base_i(h)` `[v]` plus per-leaf low-rank adapters `B_q (A_q h + a_q)`.

    One stacked matrix `proj_weight` `[M + Q*a + S, d]` (+ `proj_bias`) holds, in this order, the `M`
    rows the position logits start from, the adapters' `A` and the sum projection; `adapter_up` is
    `B` transposed, `[Q, a, v]`. Subclasses say what the first `M` rows are and how they become `[n, v]`
    logits."""

    @abstractmethod
    def _position_rows(self) -> int:  # M
        """Defined by each subclass."""

    @abstractmethod
    def _position_logits(self, y: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
        """`y` `[..., m, M/n]` (the position rows' outputs for `positions` `[m]`; None: all `n` in order)
        -> `[..., m, v]`."""

    def _build(self, dtype, adapter_rank, factor_rank) -> None:
        if adapter_rank < 0:
            raise ValueError(f"adapter_rank must be >= 0, got {adapter_rank}")
        self.options["adapter_rank"] = adapter_rank
        self.adapter_rank = adapter_rank
        rows = self._position_rows() + self.num_leaves * adapter_rank + self.num_sum_params
        self.proj_weight = nn.Parameter(torch.zeros(rows, self.hidden_size, dtype=dtype))  # [M + Q*a + S, d]
        self.proj_bias = nn.Parameter(torch.zeros(rows, dtype=dtype))
        self.adapter_up = nn.Parameter(torch.zeros(self.num_leaves, adapter_rank, self.num_states, dtype=dtype))

    def _blocks(self, t: torch.Tensor, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views of the position, adapter and sum parts of a stacked tensor along `dim` (the rows of
        `proj_weight`, `proj_bias`, or the last dim of the stacked matmul's output)."""
        m, qa = self._position_rows(), self.num_leaves * self.adapter_rank
        return t.narrow(dim, 0, m), t.narrow(dim, m, qa), t.narrow(dim, m + qa, self.num_sum_params)

    def _init_adapters(self) -> None:
        _, down, _ = self._blocks(self.proj_weight, 0)  # [Q*a, d]
        nn.init.normal_(down, std=self.hidden_size ** -0.5)  # A random, B (adapter_up) zero: no change at init

    def _sum_rows(self):
        return self._blocks(self.proj_weight, 0)[2], self._blocks(self.proj_bias)[2]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """`[..., d]` -> `[..., P]`: one stacked matmul, then the per-position and adapter products."""
        y = F.linear(h, self.proj_weight, self.proj_bias)  # [..., M + Q*a + S]
        pos, low, sums = self._blocks(y)
        n, Q, a = self.num_variables, self.num_leaves, self.adapter_rank
        base = self._position_logits(pos.unflatten(-1, (n, -1)), None)  # [..., n, v]
        leaves = base.index_select(-2, self._positions(h))  # [..., Q, v]
        if a:
            leaves = _adapt(low.unflatten(-1, (Q, a)), self.adapter_up, leaves)
        return torch.cat([leaves.flatten(-2), sums], -1)

    def input_logits(self, h: torch.Tensor, leaves: slice | torch.Tensor = slice(None)) -> torch.Tensor:
        Q, a, d, n = self.num_leaves, self.adapter_rank, self.hidden_size, self.num_variables
        chosen = torch.arange(Q, device=h.device)[leaves]  # [Qc]
        positions, which = torch.unique(self._positions(h)[chosen], return_inverse=True)  # [m], [Qc]
        pos_w, down_w, _ = self._blocks(self.proj_weight, 0)  # [M, d], [Q*a, d]
        pos_b, down_b, _ = self._blocks(self.proj_bias)
        per = self._position_rows() // n
        rows_w = pos_w.view(n, per, d)[positions].reshape(-1, d)  # [m*per, d]
        rows_b = pos_b.view(n, per)[positions].reshape(-1)
        y = F.linear(h, rows_w, rows_b).unflatten(-1, (positions.numel(), per))  # [..., m, per]
        out = self._position_logits(y, positions).index_select(-2, which)  # [..., Qc, v]
        if a:
            a_w = down_w.view(Q, a, d)[chosen].reshape(-1, d)  # [Qc*a, d]
            a_b = down_b.view(Q, a)[chosen].reshape(-1)
            low = F.linear(h, a_w, a_b).unflatten(-1, (chosen.numel(), a))  # [..., Qc, a]
            out = _adapt(low, self.adapter_up[chosen], out)
        return out


def _as_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`t` in `dtype`; itself when it already is (a draft's cycle then runs no conversion op at all)."""
    return t if t.dtype == dtype else t.to(dtype)


def _adapt(low: torch.Tensor, up: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """`base + B_q @ low_q` for every leaf: `low` `[..., Q, a]`, `up` (`B` transposed) `[Q, a, v]`,
    `base` `[..., Q, v]` -> `[..., Q, v]`."""
    Q, a, v = up.shape
    if low.numel() == Q * a:  # one hidden state (`[Q, a]` or `[1, Q, a]`, a decoding cycle's draft): one
        # batched [1, a] @ [a, v] product that adds base too; einsum's own reshapes cost as much again
        return torch.baddbmm(base.reshape(Q, 1, v), low.reshape(Q, 1, a), up).view(base.shape)
    return base + torch.einsum("...qa,qav->...qv", low, up)


class SharedHead(_AdapterHead):
    """`logits_q = E_i h + c_i + B_q (A_q h + a_q)`: one unembedding per position (the first `n*v`
    rows of `proj_weight`, position-major) plus rank-`adapter_rank` per-leaf adapters."""

    parameterisation = "shared"

    def _position_rows(self) -> int:
        return self.num_variables * self.num_states

    def _position_logits(self, y, positions):
        return y  # the rows are the unembedding itself: [..., m, v]

    def _init_inputs(self, init_from) -> None:
        n, v, d = self.num_variables, self.num_states, self.hidden_size
        table = self._blocks(self.proj_weight, 0)[0].view(n, v, d)
        if init_from is None:
            nn.init.normal_(table, std=d ** -0.5)
        else:
            table.copy_(_per_position(init_from, n, v, d, self).to(table))
        self._init_adapters()


class FactorisedHead(_AdapterHead):
    """`logits_q = U_i (V_i h + e_i) + c_i + B_q (A_q h + a_q)`: a rank-`factor_rank` unembedding per
    position (`V` = the first `n*k` rows of `proj_weight`, `U` transposed = `unembed_up` `[n, k, v]`, `c` =
    `position_bias` `[n, v]`) plus rank-`adapter_rank` per-leaf adapters."""

    parameterisation = "factorised"

    def _build(self, dtype, adapter_rank, factor_rank) -> None:
        if factor_rank < 1:
            raise ValueError(f"factor_rank must be >= 1, got {factor_rank}")
        self.options["factor_rank"] = factor_rank
        self.factor_rank = factor_rank
        super()._build(dtype, adapter_rank, factor_rank)
        n, v, k = self.num_variables, self.num_states, factor_rank
        self.unembed_up = nn.Parameter(torch.zeros(n, k, v, dtype=dtype))  # U transposed
        self.position_bias = nn.Parameter(torch.zeros(n, v, dtype=dtype))  # c

    def _position_rows(self) -> int:
        return self.num_variables * self.factor_rank

    def _position_logits(self, y, positions):
        up, bias = self.unembed_up, self.position_bias  # [m, k, v], [m, v]
        if positions is not None:
            up, bias = up[positions], bias[positions]
        if y.dim() == 2:  # one hidden state
            return torch.baddbmm(bias.unsqueeze(1), y.unsqueeze(1), up).squeeze(1)
        return torch.einsum("...mk,mkv->...mv", y, up) + bias

    def _init_inputs(self, init_from) -> None:
        n, v, d, k = self.num_variables, self.num_states, self.hidden_size, self.factor_rank
        down = self._blocks(self.proj_weight, 0)[0].view(n, k, d)  # V
        if init_from is None:
            nn.init.normal_(down, std=d ** -0.5)
            nn.init.normal_(self.unembed_up, std=k ** -0.5)
        else:
            tables = _per_position(init_from, n, v, d, self)  # [n, v, d]
            for i in range(n):
                up, dn = _low_rank(tables[i].double(), k)  # [v, k], [k, d]
                self.unembed_up[i].copy_(up.t())
                down[i].copy_(dn)
        self._init_adapters()


def _low_rank(table: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`table` `[v, d]` ~= `up @ down` with `up` `[v, k]`, `down` `[k, d]` (truncated SVD, the singular
    values split evenly; exact when `k >= rank(table)`, zero-padded beyond `min(v, d)`)."""
    u, s, vh = torch.linalg.svd(table, full_matrices=False)  # [v, r], [r], [r, d]
    r = min(k, s.numel())
    root = s[:r].sqrt()
    up, down = table.new_zeros(table.shape[0], k), table.new_zeros(k, table.shape[1])
    up[:, :r] = u[:, :r] * root
    down[:r] = root[:, None] * vh[:r]
    return up, down


class TiedHead(MTPHead):
    """`logits_q = W[:v] (h + U_q (D_q h + e_q)) + b[:v]` (the draft vocabulary's rows of `W` and `b` when
    the head has one): the LM's own output layer `W` (+ bias `b`),
    referenced (never a parameter, so never trained, copied or saved) behind per-leaf low-rank adapters
    in hidden space. `proj_weight` `[Q*a + S, d]` stacks the adapters' `D` and the sum projection;
    `adapter_up` is `U` transposed, `[Q, a, d]`, zero at initialisation, so every leaf starts as the
    LM's next-token distribution over states `0 .. v-1`."""

    parameterisation = "tied"

    def _build(self, dtype, adapter_rank, factor_rank) -> None:
        if adapter_rank < 1:
            raise ValueError(f"the tied head needs adapter_rank >= 1, got {adapter_rank}")
        self.options["adapter_rank"] = adapter_rank
        self.adapter_rank = adapter_rank
        rows = self.num_leaves * adapter_rank + self.num_sum_params
        self.proj_weight = nn.Parameter(torch.zeros(rows, self.hidden_size, dtype=dtype))  # [Q*a + S, d]
        self.proj_bias = nn.Parameter(torch.zeros(rows, dtype=dtype))
        self.adapter_up = nn.Parameter(torch.zeros(self.num_leaves, adapter_rank, self.hidden_size, dtype=dtype))
        self._tied: tuple[torch.Tensor, torch.Tensor | None] | None = None  # a plain attribute: not in state_dict

    def tie_to(self, output: nn.Module | torch.Tensor) -> "TiedHead":
        """Read the input units from `output` (the LM's output layer, or its weight `[V, d]`); returns self."""
        weight = output.weight if isinstance(output, nn.Module) else output
        bias = getattr(output, "bias", None) if isinstance(output, nn.Module) else None
        needed = self.num_states if self.vocabulary is None else max(self.vocabulary) + 1
        if weight.dim() != 2 or weight.shape[1] != self.hidden_size or weight.shape[0] < needed:
            raise ValueError(f"the output layer has shape {tuple(weight.shape)}; the tied head needs [V >= "
                             f"{needed}, {self.hidden_size}]")
        # the states' rows: a view of the first v (the same storage), or the draft vocabulary's, gathered once
        # (the output layer is frozen: a copy of v rows, never saved)
        rows = self.vocabulary_rows(weight.detach())  # [v, d]
        self._tied = (rows, None if bias is None else self.vocabulary_rows(bias.detach()))
        return self

    @property
    def tied(self) -> bool:
        return self._tied is not None

    def _init_inputs(self, init_from) -> None:
        if init_from is not None:
            self.tie_to(init_from)
        down = self.proj_weight[: self.num_leaves * self.adapter_rank]
        nn.init.normal_(down, std=self.hidden_size ** -0.5)  # D random, U zero: no change at init

    def _sum_rows(self):
        qa = self.num_leaves * self.adapter_rank
        return self.proj_weight[qa:], self.proj_bias[qa:]

    def input_logits(self, h: torch.Tensor, leaves: slice | torch.Tensor = slice(None)) -> torch.Tensor:
        if self._tied is None:
            raise ValueError("this tied head has no output layer; call head.tie_to(model.get_output_embeddings())")
        Q, a, d = self.num_leaves, self.adapter_rank, self.hidden_size
        chosen = torch.arange(Q, device=h.device)[leaves]  # [Qc]
        qa = Q * a
        down_w = self.proj_weight[:qa].view(Q, a, d)[chosen].reshape(-1, d)  # [Qc*a, d]
        down_b = self.proj_bias[:qa].view(Q, a)[chosen].reshape(-1)
        low = F.linear(h, down_w, down_b).unflatten(-1, (chosen.numel(), a))  # [..., Qc, a]
        shifted = h.unsqueeze(-2) + torch.einsum("...qa,qad->...qd", low, self.adapter_up[chosen])  # [..., Qc, d]
        weight, bias = self._tied
        # contiguous: torch's bf16 CPU matmul of a strided input takes a slow path (450x at [1024, 4, 576])
        out = F.linear(shifted.to(weight.dtype).contiguous(), weight, bias)  # [..., Qc, v]
        return out.to(h.dtype)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """`[..., d]` -> `[..., P]`."""
        return torch.cat([self.input_logits(h).flatten(-2), self.sum_logits(h)], -1)


_HEADS = {cls.parameterisation: cls for cls in (FullHead, SharedHead, FactorisedHead, TiedHead)}


def _per_position(init_from, n: int, v: int, d: int, head: MTPHead) -> torch.Tensor:
    """One `[v, d]` table per window position from `[V, d]`, `[n, V, d]` or a list of `n` `[V, d]`."""
    if isinstance(init_from, torch.Tensor) and init_from.dim() == 2:
        tables = [init_from] * n
    elif isinstance(init_from, torch.Tensor) and init_from.dim() == 3 or isinstance(init_from, (list, tuple)):
        tables = list(init_from)
        if len(tables) != n:
            raise ValueError(f"init_from has {len(tables)} embeddings; the circuit has {n} window positions")
    else:
        raise ValueError("init_from must be an output embedding [V, d], a list of n of them, or [n, V, d]")
    for i, table in enumerate(tables):
        if table.dim() != 2 or table.shape[1] != d:
            raise ValueError(f"init_from[{i}] has shape {tuple(table.shape)}; expected [V, {d}] (hidden_size={d})")
        if head.vocabulary is None and table.shape[0] < v:
            raise ValueError(f"init_from[{i}] has {table.shape[0]} rows but the circuit has {v} states "
                             "(state s = token id s, so the LM vocabulary must cover every state)")
        if head.vocabulary is not None and table.shape[0] <= max(head.vocabulary):
            raise ValueError(f"init_from[{i}] has {table.shape[0]} rows but the draft vocabulary names token id "
                             f"{max(head.vocabulary)}")
    return torch.stack([head.vocabulary_rows(t.detach()) for t in tables])  # [n, v, d]


# --------------------------------------------------------------------------- save / load (the files: `storage`)

def save_head(head: MTPHead, directory: str | Path) -> Path:
    """Write `head.safetensors` (the head's parameters by name) and `head.json` (graph spec,
    parameterisation and options) into `directory`."""
    tensors = {name: t.detach().contiguous().cpu() for name, t in head.state_dict().items()}
    return write_head_files(directory, head.config(), tensors)


def load_head(directory: str | Path, device: torch.device | str | None = None) -> MTPHead:
    """Rebuild a head saved by `save_head` (or `save_pretrained`): compile its graph, check the sizes
    it implies against `head.safetensors`' header and the machine's memory, then build it and load its
    weights (exact, same dtype, or widened to `head.json`'s `compute_dtype`). A damaged folder raises `InputError` naming the file and what is wrong,
    before anything the size of the head is allocated."""
    directory = readable_folder(directory, "head folder")
    config = read_head_config(directory / CONFIG_FILE)
    weights = directory / WEIGHTS_FILE
    if not weights.exists() and not weights.is_symlink():
        raise InputError(f"{directory} has no {WEIGHTS_FILE} (the head's weights)")
    inside(weights, directory)
    try:
        header = safetensors_header(weights)
    except InputError as e:  # the head's own wording: "<file>: not a readable safetensors file"
        raise InputError(f"{weights}: not a readable safetensors file, truncated or damaged? ({e})") from None
    circ, shapes = _planned_shapes(config, directory)
    check_weights_header(header, shapes, weights, config.get("parameterisation", "full"))
    check_memory(shapes, weights)
    tensors = read_head_weights(weights)
    head = _head_from_config(config, circ, tensors, directory)
    return head.to(device) if device is not None else head


def _planned_shapes(config: dict, directory: Path):
    """The compiled circuit of `config` and the state dict's shapes its head would have, found by
    building the head on the meta device (no memory: sizes only)."""
    import circuitc

    kwargs, ranks = head_arguments(config)
    try:
        circ = circuitc.compile(config["graph"])
        with torch.device("meta"):
            head = MTPHead(circ, config["hidden_size"], **kwargs, **ranks)
    except (ValueError, TypeError) as e:
        raise InputError(f"{directory / CONFIG_FILE}: cannot build the head ({first_line(e)})") from None
    return circ, {name: tuple(t.shape) for name, t in head.state_dict().items()}


def _head_from_config(config: dict, circ, tensors: dict[str, torch.Tensor], directory: Path) -> MTPHead:
    kwargs, ranks = head_arguments(config)
    try:
        head = MTPHead(circ, config["hidden_size"], dtype=compute_dtype(config, tensors, directory),
                       **kwargs, **ranks)
    except (ValueError, TypeError) as e:
        raise InputError(f"{directory / CONFIG_FILE}: cannot build the head ({first_line(e)})") from None
    head.graph = config["graph"]
    expected = head.state_dict()
    weights = directory / WEIGHTS_FILE
    if set(expected) != set(tensors):
        raise InputError(f"{weights} holds {sorted(tensors)[:8]}; a {kwargs['parameterisation']!r} head has "
                         f"{sorted(expected)}")
    for name, target in expected.items():
        if target.shape != tensors[name].shape:
            raise InputError(f"{weights}: {name} has shape {tuple(tensors[name].shape)}, the graph and options in "
                             f"{CONFIG_FILE} need {tuple(target.shape)}")
    head.load_state_dict(tensors)
    return head
