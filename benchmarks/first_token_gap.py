"""Where a SmolLM2 head's first drafted token is lost between its teacher-forced scores and decoding.

Teacher-forced scores (`depth_acceptance.py`, `mtpc train`'s `val_depth_topk`) count only windows whose tokens
all lie in the head's draft vocabulary, and score them against the text's own tokens; a decoder meets every
position, and keeps a drafted token when it is the LM's greedy one. Two measurements take those apart.

`decoded`: the bench's own prompts (a `bench.json`'s `prompt_ids`), continued greedily by the LM (bf16,
transformers' `generate`), then one forward over prompt and continuation, as `mtpc features` runs it. At each
position of the continuation where a cycle could start (the committed token `x_0` there, the LM's next token
`x_1` after it), the head's first drafted token (its most probable `x_1` given `h` and `x_0`) is compared
with `x_1`, over every position and split by whether `x_0` and `x_1` are in the draft vocabulary (an `x_0`
without a state summed out of the circuit, as the decoder drafts, and taken for its last state); then again
with each prompt's own tokens added to the draft vocabulary (a context vocabulary: the tied head scores any
token through the LM's output layer; the first-token embedding of an added state is a least-squares map of
the LM's input embedding fitted on the vocabulary's trained rows). Beside it, the first-token acceptance the
bench recorded in decoding for the same head and prompts.

`sources`: a features store of held-out text (its val split): the head's first drafted token against the
text's next token and against the LM's greedy token there (the store's `greedy`, the LM's argmax given the
text), over the windows `depth_acceptance.py` scores and over every window whose `x_0` and targets exist.

    python benchmarks/first_token_gap.py --model $G --head models/heads/smollm2-cp4-k2048-own \\
        --bench docs/bench/smollm2-cp/greedy-bf16/bench.json --features runs/features-nx \\
        --out benchmarks/results/first_token_gap_smollm2.json

Prints a Markdown table and writes the record as JSON.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mtpc.lm import loading  # noqa: E402
from mtpc.checks import positive_int  # noqa: E402
from mtpc.decoding import load_head_entry  # noqa: E402
from mtpc.heads.nll_loss import teacher_forced_ranks  # noqa: E402
from mtpc.heads.windows import target_validity, window_targets  # noqa: E402
from mtpc.training.data import collate, spread  # noqa: E402
from mtpc.training.features import FeatureSet  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # its sibling scripts
from results_file import write_results  # noqa: E402
from script_args import (ScriptParser, existing_file, existing_folder, output_file, run_main,  # noqa: E402
                         torch_threads)

BLOCK = 256  # positions scored at once (bounds the circuit's [N, v] conditionals)


def first_token_hits(head, hidden: torch.Tensor, first: torch.Tensor, target: torch.Tensor,
                     as_last_state: bool = False) -> torch.Tensor:
    """`[N]` bool: the head's most probable first drafted token, given `hidden` `[N, d]` and the committed token
    `first` `[N]`, is `target` `[N]` (token ids; one outside the draft vocabulary is a miss). A `first` without
    a state is summed out of the circuit, as the decoder drafts; `as_last_state`: taken for the last state (the
    decoder's former rule)."""
    x0, x1 = head.states_of(first), head.states_of(target)  # [N]
    x = torch.full((len(first), head.num_variables), -1, dtype=torch.long)
    x[:, 0], x[:, 1] = x0.clamp_max(head.num_states - 1) if as_last_state else x0, x1  # later depths invalid
    hits = []
    for i in range(0, len(x), BLOCK):
        h = head.with_first_token(hidden[i:i + BLOCK], x0[i:i + BLOCK])
        hits.append(teacher_forced_ranks(head, h, x[i:i + BLOCK], True)[:, 0] == 0)
    return torch.cat(hits) if hits else torch.zeros(0, dtype=torch.bool)


def share(mask: torch.Tensor, of: torch.Tensor | None = None) -> dict:
    """`{"hits": k, "positions": m, "rate": k / m}` of `mask` over the positions `of` selects (all: None)."""
    of = torch.ones_like(mask) if of is None else of
    k, m = int((mask & of).sum()), int(of.sum())
    return {"hits": k, "positions": m, "rate": round(k / m, 4) if m else None}


def widened_head(folder: Path, extra: list[int], embedding: torch.Tensor, out: Path):
    """A copy of the tied head in `folder` with `extra` token ids added as states after its vocabulary, in `out`;
    the added states' first-token rows are `embedding[extra] @ M`, `M` the least-squares map from the LM's input
    embedding `[V, d]` of the vocabulary to the trained first-token rows."""
    from safetensors.torch import load_file, save_file

    config = json.loads((folder / "head.json").read_text())
    weights = load_file(folder / "head.safetensors")
    vocabulary = config["vocabulary"]
    trained = weights["first_embedding"].float()  # [v, d]
    fit = torch.linalg.lstsq(embedding[vocabulary], trained).solution  # [d, d]
    rows = embedding[extra] @ fit  # [E, d]
    config = {**config, "vocabulary": vocabulary + extra,
              "graph": {**config["graph"], "states": len(vocabulary) + len(extra)}}
    weights["first_embedding"] = torch.cat([trained, rows]).to(weights["first_embedding"].dtype)
    out.mkdir(parents=True, exist_ok=True)
    (out / "head.json").write_text(json.dumps(config))
    save_file(weights, out / "head.safetensors")
    return out


def decoded(model, model_path: str, head_folder: Path, bench: dict) -> dict:
    """The first measurement (see the module's docstring), prompt by prompt."""
    cpu = torch.device("cpu")
    head = load_head_entry(str(head_folder), model, model_path, torch.float32, None, cpu).head
    if head.vocabulary is None or head.parameterisation != "tied":
        raise SystemExit("first_token_gap: decoded needs a tied head with a draft vocabulary")
    embedding = model.get_input_embeddings().weight.detach().float()  # [V, d]
    prompts = [p for group in bench["prompt_ids"] for p in group]
    base, as_last, wide, x0_in, x1_in, x1_wide = [], [], [], [], [], []
    added = []
    with torch.no_grad(), tempfile.TemporaryDirectory() as scratch:
        for i, prompt in enumerate(prompts):
            ids = torch.tensor([prompt])
            text = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                  max_new_tokens=bench["config"]["max_new_tokens"], pad_token_id=0)[0]  # [T]
            hidden = model.get_decoder()(input_ids=text[None]).last_hidden_state[0].float()  # [T, d]
            t = torch.arange(len(prompt) - 1, len(text) - 2)  # a cycle's start: x_0 = text[t + 1]
            first, target = text[t + 1], text[t + 2]
            base.append(first_token_hits(head, hidden[t], first, target))
            as_last.append(first_token_hits(head, hidden[t], first, target, as_last_state=True))
            extra = sorted(set(prompt) - set(head.vocabulary))
            added.append(len(extra))
            folder = widened_head(head_folder, extra, embedding, Path(scratch) / f"p{i}")
            wider = load_head_entry(str(folder), model, model_path, torch.float32, None, cpu).head
            wide.append(first_token_hits(wider, hidden[t], first, target))
            x0_in.append(head.states_of(first) < head.num_states)
            x1_in.append(head.states_of(target) < head.num_states)
            x1_wide.append((wider.states_of(first) < wider.num_states) & (wider.states_of(target) < wider.num_states))
    base, as_last, wide, x0_in, x1_in, x1_wide = map(torch.cat, (base, as_last, wide, x0_in, x1_in, x1_wide))
    both = x0_in & x1_in
    return {"prompts": len(prompts), "new_tokens": bench["config"]["max_new_tokens"],
            "added_states_per_prompt": round(sum(added) / len(added), 1),
            "x0_and_x1_in_vocabulary": share(both), "x0_and_x1_in_widened_vocabulary": share(x1_wide),
            "every_position": share(base), "x0_and_x1_in_vocabulary_only": share(base, both),
            "x0_outside_vocabulary": share(base, ~x0_in), "x0_outside_as_last_state": share(as_last, ~x0_in),
            "widened_every_position": share(wide), "widened_positions_gained": share(wide, x1_wide & ~both),
            "decoding_first_token": recorded_first_token(bench, str(head_folder))}


def recorded_first_token(bench: dict, head_folder: str) -> float | None:
    """The bench's own first-drafted-token acceptance for the head alone (eager chain row), if it ran it."""
    name = Path(head_folder).name
    for row in bench.get("heads", []):
        if row.get("label") == name and row.get("position_acceptance"):
            return row["position_acceptance"][0]
    return None


def sources(model, model_path: str, head_folder: Path, features: str, sequences: int) -> dict:
    """The second measurement (see the module's docstring)."""
    cpu = torch.device("cpu")
    info = loading.model_info(model_path, subword_ok=True)
    head = load_head_entry(str(head_folder), model, model_path, torch.float32, None, cpu).head
    store = FeatureSet(features, "val", info, type(loading.model_tokenizer(info)).__name__)
    batch = collate(store[i] for i in spread(len(store), sequences))
    n = head.num_variables
    valid = target_validity(batch["doc_ids"], batch["loss_mask"].bool(), n)  # [B, T, n]
    tokens, greedy = batch["tokens"], batch["greedy"]  # [B, T]
    B, T = tokens.shape
    t = torch.arange(T - 2)
    exists = valid[:, t, :2].all(-1).flatten()  # x_0 and x_1 in the same document, in the loss mask
    first = tokens[:, t + 1].flatten()[exists]
    text_next, lm_next = tokens[:, t + 2].flatten()[exists], greedy[:, t + 1].flatten()[exists]
    hidden = batch["hidden"][:, t].flatten(0, 1)[exists].float()  # [N, d]
    whole = valid[:, t].all(-1).flatten()[exists]  # the n targets exist
    states = window_targets(head.states_of(tokens), n, fill=-1)[:, t]  # [B, T - 2, n]
    in_vocabulary = whole & ((states >= 0) & (states < head.num_states)).all(-1).flatten(0, 1)[exists]
    against_text = first_token_hits(head, hidden, first, text_next)
    against_lm = first_token_hits(head, hidden, first, lm_next)
    return {"features": str(features), "sequences": B,
            "windows_scored_by_depth_acceptance": share(against_text, in_vocabulary),
            "same_windows_against_lm_greedy": share(against_lm, in_vocabulary),
            "every_window_against_text": share(against_text), "every_window_against_lm_greedy": share(against_lm),
            "lm_greedy_is_the_text": share(lm_next == text_next)}


def table(record: dict) -> str:
    d, s = record.get("decoded"), record.get("sources")
    rows = ["| where | what | positions | first drafted token right |", "| --- | --- | ---: | ---: |"]
    cell = lambda r: f"{r['positions']:,} | {r['rate']:.3f}" if r["rate"] is not None else f"{r['positions']} | -"  # noqa: E731
    if d:
        rows += [f"| the LM's continuations of the bench's prompts | every position | {cell(d['every_position'])} |",
                 f"| | x_0 and x_1 in the draft vocabulary | {cell(d['x0_and_x1_in_vocabulary_only'])} |",
                 f"| | x_0 outside it (summed out of the circuit) | {cell(d['x0_outside_vocabulary'])} |",
                 f"| | x_0 outside it, taken for the last state | {cell(d['x0_outside_as_last_state'])} |",
                 f"| | every position, the prompt's tokens added (+{d['added_states_per_prompt']} states) | "
                 f"{cell(d['widened_every_position'])} |",
                 f"| | the positions that adding them brought in | {cell(d['widened_positions_gained'])} |"]
        if d["decoding_first_token"] is not None:
            rows.append(f"| | decoding, the bench's record | cycles | {d['decoding_first_token']:.3f} |")
    if s:
        rows += [f"| held-out text (store {Path(s['features']).name}) | depth_acceptance.py's windows, the text's "
                 f"token | {cell(s['windows_scored_by_depth_acceptance'])} |",
                 f"| | the same windows, the LM's greedy token | {cell(s['same_windows_against_lm_greedy'])} |",
                 f"| | every window, the text's token | {cell(s['every_window_against_text'])} |",
                 f"| | every window, the LM's greedy token | {cell(s['every_window_against_lm_greedy'])} |",
                 f"| | the LM's own greedy token is the text's | {cell(s['lm_greedy_is_the_text'])} |"]
    return "\n".join(rows)


def main(argv=None) -> dict:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--head", required=True)
    parser.add_argument("--bench", type=existing_file, default=None,
                        help="a bench.json of --model: its prompts (the decoded measurement)")
    parser.add_argument("--features", type=existing_folder, default=None,
                        help="a features store of --model (the sources measurement)")
    parser.add_argument("--sequences", type=positive_int, default=64, help="held-out sequences read from --features")
    parser.add_argument("--threads", type=torch_threads, default=1)
    parser.add_argument("--out", type=output_file, default=None)
    args = parser.parse_args(argv)
    if not args.bench and not args.features:
        parser.error("give --bench, --features or both")
    torch.set_num_threads(args.threads)
    model = loading.load_model(args.model).to(torch.bfloat16).eval()
    record = {"model": Path(args.model).name, "head": args.head, "dtype": "bf16", "threads": args.threads}
    if args.bench:
        bench = json.loads(Path(args.bench).read_text())
        record["bench"] = args.bench
        record["decoded"] = decoded(model, args.model, Path(args.head), bench)
    if args.features:
        record["sources"] = sources(model, args.model, Path(args.head), args.features, args.sequences)
    print(table(record))
    write_results(record, args.out)
    return record


if __name__ == "__main__":
    run_main(main)
