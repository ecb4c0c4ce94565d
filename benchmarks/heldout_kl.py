"""How close each head is to the LM, and to the text, on held-out sequences.

For every head: the KL loss (`mtpc.heads.kl_loss`, Eq. 5 weighting) from the LM's own next-byte distributions
to the head's conditionals, its terms at window positions 1 and n, and the NLL loss (`mtpc.heads.nll_loss`) of the
gold bytes, on the same randomly chosen held-out sequences of the corpus split `mtpc train` uses.

Usage: python benchmarks/heldout_kl.py --model runs/tiny-lm --heads runs/ff8-nll runs/ff8-kl [--data SRC]
           [--sequences 32] [--seq-len 256] [--seed 0]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mtpc.checks import data_source, positive_int, seed  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # its sibling scripts
from script_args import ScriptParser, run_main  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--heads", nargs="+", required=True)
    parser.add_argument("--data", default=None, help="corpus (default: the Python stdlib, as mtpc train)")
    parser.add_argument("--sequences", type=positive_int, default=32)
    parser.add_argument("--seq-len", type=positive_int, default=256)
    parser.add_argument("--val-fraction", type=float, default=0.02)
    parser.add_argument("--seed", type=seed, default=0)
    args = parser.parse_args(argv)
    if not 0 < args.val_fraction < 1:  # NaN included
        parser.error(f"--val-fraction is the held-out share, in (0, 1); got {args.val_fraction}")
    data_source(args.data)

    from transformers import AutoModelForCausalLM

    from mtpc.training.data import PackedDataset, collate, load_documents, split_documents
    from mtpc.heads.head import load_head
    from mtpc.lm.families import OutputLayer
    from mtpc.heads.kl_loss import kl_loss, lm_teacher
    from mtpc.heads.nll_loss import mtp_loss
    from mtpc.lm.tokenizer import ByteTokenizer

    tok = ByteTokenizer.load(args.model)
    lm = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    docs, _ = load_documents(args.data, tok)
    _, held_out = split_documents(docs, args.val_fraction)
    data = PackedDataset(held_out, args.seq_len, tok.pad_id)
    picks = torch.randperm(len(data), generator=torch.Generator().manual_seed(args.seed))[:args.sequences]
    batch = collate(data[int(i)] for i in picks)
    masks = (batch["tokens"], batch["doc_ids"], batch["loss_mask"])
    with torch.no_grad():
        h = lm.get_decoder()(input_ids=batch["tokens"]).last_hidden_state  # [B, T, d]
        teacher = lm_teacher(OutputLayer(lm), h)  # the model's own logits (soft-capping included)
        print(f"{'head':<24} {'KL to LM':>9} {'KL j=1':>7} {'KL j=n':>7} {'NLL':>8}  (nats; {len(picks)} held-out "
              f"sequences of {args.seq_len} bytes)")
        for path in args.heads:
            head = load_head(path).float().eval()
            if head.parameterisation == "tied":  # its units are the LM's own output layer
                head.tie_to(lm.get_output_embeddings())
            kl = kl_loss(head, h, teacher, *masks)
            nll = mtp_loss(head, h, *masks)
            per_position = kl.term_sums / kl.counts.clamp(min=1)
            print(f"{path:<24} {kl.loss.item():9.3f} {per_position[0].item():7.3f} {per_position[-1].item():7.3f} "
                  f"{nll.loss.item():8.3f}")


if __name__ == "__main__":
    run_main(main)
