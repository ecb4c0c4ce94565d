"""The runtime: every program of a compiled circuit, executed from a `Plan` fold by fold.

`CompiledCircuit(plan)` is a `torch.nn.Module` with no trainable parameters: the circuit's logits
come with every call (`theta`, `[B, P]` per example or `[P]` shared), as in multi-token prediction
where a neural head produces them. Index maps are buffers, so `.to(device)` moves them.

One module per part, in the order they build on each other:

- `kernels`: one sum layer in log space (sum or max semiring) and the leaves' log-space reductions;
- `executor`: `Executor(plan)`, the plan's index maps as buffers and the upward and top-down passes;
- `inputs`: leaf values `[Q, B]` and per-fold sum weights from checked arguments;
- `likelihood`, `marginals`, `sampling`, `max_product`: the queries, functions of the executor;
- `arguments`: one argument check per public program; `fuse`: the torch.compile'd queries;
- `circuit`: `CompiledCircuit`, each public program a check and a query run through one wrapper;
- `draft`: `DraftProgram`, the fixed-shape programs a decoder drafts with (greedy and sampled windows, a
  tree's conditionals), built on a compiled circuit.

Conventions (shapes in comments): `B` batch, `Bp` the parameter batch (1 when theta is shared, else
`B`), `Q` leaves (input units), `v` states, `F` regions in a fold, `R` rows per region (1, or the
scope size for prefix marginals), `U` units, `K` sum inputs, `S` samples per example.

All values are log-probabilities. A sum layer uses the max-shift trick: `m + log(W @ exp(x - m))`
with `W` the softmax-normalised weights (one matmul instead of materialising `log W + x`); the
matmul result is floored at the dtype's smallest normal number so that a sum whose every term
underflows (possible only when sum logits differ by more than ~87 nats in float32) stays finite.
bfloat16 and float16 parameters are computed in float32; float64 stays float64.
"""

from .circuit import CompiledCircuit

__all__ = ["CompiledCircuit"]
