"""MTP draft heads: hidden states of an LM become the flat parameters of any compiled circuit.

`head = MTPHead(circ, hidden_size)` maps `h` `[..., d]` to the circuit's flat logits `theta`
`[..., P]` (the runtime contract's layout: all input slots, leaf by leaf `[v]` rows, then all sum
slots). Parameterisation `"full"` is the paper's: every input unit (leaf) has its own unembedding
`W_q` `[v, d]` (together `W ∈ R^{n×r×v×d}`), every sum slot a projection `R` to its `[U, K]` logits.
All of it is one matrix `[P, d]` plus a bias `[P]`, so `head(h)` is a single matmul; the split views
`input_logits(h, leaves)` and `sum_logits(h)` read row blocks of the same matrix.

Vocabulary mapping: circuit state `s` is token id `s`. A circuit with `v` states drafts token ids
`0 .. v-1` of an LM whose vocabulary may be larger (a byte circuit, v = 256, over a byte LM with a few
special tokens appended); `init_from` rows `0 .. v-1` initialise the units.

Initialisation (`init_from` = the LM's output embedding `[V, d]`, or a list of `n`, one per window
position): every unit of position `i` starts as rows `0 .. v-1` of embedding `i` and the sum
projections start at zero (uniform mixtures), so at initialisation any circuit (CP, HMM, BTree, ...)
is exactly the fully factorised product of per-position softmaxes of the LM head. Note for training:
with identical units and uniform sums every unit receives the same gradient, so the symmetry never
breaks by itself; `sum_init_std > 0` (random sum projections) breaks it while keeping the FF
distribution at initialisation exact (a mixture of identical components is that component).
`identity_init = a` adds `a` to the diagonal of every square sum block (`U == K`): HMM transitions
start near the identity (paper Appendix H).

`save_head(head, dir)` / `load_head(dir)`: `head.safetensors` + `head.json` (the circuit's graph spec
and the head options); the round trip is exact.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MTPHead", "save_head", "load_head", "PARAMETERISATIONS", "HEAD_FORMAT"]

HEAD_FORMAT = "mtpc-head/1"
PARAMETERISATIONS = ("full",)


def _load_and_compile(source):
    """(RegionGraph, CompiledCircuit) from any source `circuitc.compile` accepts (no bindings)."""
    import circuitc
    from circuitc.load import load_graph

    graph = load_graph(source)
    return graph, circuitc.compile(graph)


def _graph_of(circ):
    """The RegionGraph a compiled circuit was built from, when it keeps one."""
    graph = getattr(circ, "graph", None)
    if graph is None:
        graph = getattr(getattr(circ, "plan", None), "graph", None)
    return graph


class MTPHead(nn.Module):
    """Hidden states `[..., d]` -> flat circuit logits `[..., P]` (see the module docstring).

    `circ`: a `CompiledCircuit`, or a source `circuitc.compile` accepts without bindings (RegionGraph,
    graph-spec dict, `.json`/`.pc` path or text); a head built from a source keeps its graph, so it
    can be saved. The circuit is a submodule, so `.to(device)` moves it too.
    """

    def __init__(self, circ, hidden_size: int, init_from: torch.Tensor | Sequence[torch.Tensor] | None = None, *,
                 parameterisation: str = "full", identity_init: float | None = None, sum_init_std: float = 0.0,
                 dtype: torch.dtype | None = None):
        super().__init__()
        if parameterisation not in PARAMETERISATIONS:
            raise ValueError(f"unknown head parameterisation {parameterisation!r}; known: {PARAMETERISATIONS}")
        graph = None
        if not isinstance(circ, nn.Module):
            graph, circ = _load_and_compile(circ)
        self.circ = circ
        self.graph = _graph_of(circ) or graph
        self.hidden_size = int(hidden_size)
        self.parameterisation = parameterisation
        self.options = {"identity_init": identity_init, "sum_init_std": float(sum_init_std)}
        layout = circ.param_layout
        inputs = [s for s in layout if s.kind == "input"]
        self.num_states = inputs[0].shape[1]  # v
        self.num_variables = int(circ.leaf_variable.max()) + 1  # n
        self.num_leaves = int(circ.num_leaves)  # Q
        self.num_input_params = int(circ.num_input_params)
        self.num_params = int(circ.num_params)
        dtype = dtype or torch.get_default_dtype()
        self.weight = nn.Parameter(torch.zeros(self.num_params, self.hidden_size, dtype=dtype))  # [P, d]
        self.bias = nn.Parameter(torch.zeros(self.num_params, dtype=dtype))  # [P]
        self._initialise(init_from, identity_init, sum_init_std)

    # ----------------------------------------------------------------- initialisation

    @torch.no_grad()
    def _initialise(self, init_from, identity_init, sum_init_std) -> None:
        n, v, d, Q = self.num_variables, self.num_states, self.hidden_size, self.num_leaves
        leaf_rows = self.weight[: self.num_input_params].view(Q, v, d)  # [Q, v, d]
        if init_from is None:
            nn.init.normal_(leaf_rows, std=d ** -0.5)
        else:
            tables = _per_position(init_from, n, v, d)  # [n, v, d]
            leaf_rows.copy_(tables[self.circ.leaf_variable.cpu()].to(leaf_rows))
        sums = self.weight[self.num_input_params:]  # [S, d]
        if sum_init_std:
            nn.init.normal_(sums, std=sum_init_std)
        if identity_init:
            for slot in self.circ.param_layout:
                U, K = slot.shape
                if slot.kind == "sum" and U == K:
                    diag = slot.offset + torch.arange(U) * (K + 1)
                    self.bias[diag] += identity_init

    # ----------------------------------------------------------------- the contract

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """`[..., d]` -> `[..., P]`: one matmul."""
        return F.linear(h, self.weight, self.bias)

    def input_logits(self, h: torch.Tensor, leaves: slice | torch.Tensor = slice(None)) -> torch.Tensor:
        """`[..., d]` -> `[..., Q_chunk, v]` for the leaves selected by a slice or a LongTensor of leaf
        indices (leaf order as the circuit's)."""
        v = self.num_states
        rows_w = self.weight[: self.num_input_params].view(self.num_leaves, v, self.hidden_size)[leaves]
        rows_b = self.bias[: self.num_input_params].view(self.num_leaves, v)[leaves]
        out = F.linear(h, rows_w.reshape(-1, self.hidden_size), rows_b.reshape(-1))  # [..., Qc * v]
        return out.unflatten(-1, (-1, v))

    def sum_logits(self, h: torch.Tensor) -> torch.Tensor:
        """`[..., d]` -> `[..., P - num_input_params]`."""
        return F.linear(h, self.weight[self.num_input_params:], self.bias[self.num_input_params:])

    def config(self) -> dict[str, Any]:
        """What `load_head` needs to rebuild this head (the weights aside)."""
        if self.graph is None:
            raise ValueError("this head's circuit does not keep its RegionGraph, so it cannot be saved; build "
                             "the head from a RegionGraph or a circuit that has `.graph`")
        return {
            "format": HEAD_FORMAT,
            "hidden_size": self.hidden_size,
            "parameterisation": self.parameterisation,
            "options": self.options,
            "dtype": str(self.weight.dtype).removeprefix("torch."),
            "vocabulary": "circuit state s = token id s",
            "graph": self.graph.to_json(),
        }

    def extra_repr(self) -> str:
        return (f"n={self.num_variables}, v={self.num_states}, leaves={self.num_leaves}, params={self.num_params}, "
                f"hidden_size={self.hidden_size}, parameterisation={self.parameterisation!r}")


def _per_position(init_from, n: int, v: int, d: int) -> torch.Tensor:
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
        if table.shape[0] < v:
            raise ValueError(f"init_from[{i}] has {table.shape[0]} rows but the circuit has {v} states "
                             "(state s = token id s, so the LM vocabulary must cover every state)")
    return torch.stack([t.detach()[:v] for t in tables])  # [n, v, d]


# --------------------------------------------------------------------------- save / load

WEIGHTS_FILE = "head.safetensors"
CONFIG_FILE = "head.json"


def save_head(head: MTPHead, directory: str | Path) -> Path:
    """Write `head.safetensors` (weight, bias) and `head.json` (graph spec + options) into `directory`."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = head.config()
    tensors = {"weight": head.weight.detach().contiguous().cpu(), "bias": head.bias.detach().contiguous().cpu()}
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": HEAD_FORMAT})
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=1))
    return directory


def load_head(directory: str | Path, device: torch.device | str | None = None) -> MTPHead:
    """Rebuild a head saved by `save_head`: compile its graph, load its weights (exact, same dtype)."""
    from safetensors.torch import load_file

    from circuitc.graph import RegionGraph

    directory = Path(directory)
    try:
        config = json.loads((directory / CONFIG_FILE).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{directory} has no {CONFIG_FILE}; is it a directory written by save_head?") from None
    if config.get("format") != HEAD_FORMAT:
        raise ValueError(f"{directory / CONFIG_FILE}: format {config.get('format')!r}, expected {HEAD_FORMAT!r}")
    graph = RegionGraph.from_json(config["graph"])
    tensors = load_file(str(directory / WEIGHTS_FILE))
    options = config.get("options", {})
    head = MTPHead(graph, config["hidden_size"], parameterisation=config["parameterisation"],
                   identity_init=options.get("identity_init"), sum_init_std=options.get("sum_init_std", 0.0),
                   dtype=tensors["weight"].dtype)
    head.graph = graph
    with torch.no_grad():
        for name in ("weight", "bias"):
            target = getattr(head, name)
            if target.shape != tensors[name].shape:
                raise ValueError(f"{directory / WEIGHTS_FILE}: {name} has shape {tuple(tensors[name].shape)}, "
                                 f"the graph needs {tuple(target.shape)}")
            target.copy_(tensors[name])
    return head.to(device) if device is not None else head
