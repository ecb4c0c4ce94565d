"""Proposers only propose: a third proposer, written against `mtpc.decoding.drafts.proposers` alone, plugs into
the decoder unchanged, and decoding stays exact (greedy identical, sampling by chi-square with a control)."""

import pytest
import torch

from mtpc import SpeculativeDecoder
from mtpc.decoding import PlainDecoder
from mtpc.decoding.drafts.proposers import Outcome, RowView, point_mass_window
from mtpc.sampling import Sampling
from test_decode import (PROMPT, BlockResidualIsTarget, batched_samples, chi_square_pvalue, cyclic_lm, exact_joint,
                         oracle_tables, random_head)

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, N = 12, 4


class NextInCycle:
    """Proposes `x_0 + 1, x_0 + 2` (mod V), the cyclic LM's likely continuation, as a small draft LM would:
    after an even `x_0` only (a choice from the past), and not again right after a window it lost."""

    name = "next-in-cycle"
    widths = (3,)
    span = 3

    def __init__(self):
        self.kept: list[int] = []
        self.observed: list[Outcome] = []

    def start(self, prompts):
        self.kept = [1] * len(prompts)

    def propose(self, row: RowView):
        if row.first % 2:
            return None
        if self.kept[row.row] <= 0:
            self.kept[row.row] += 1  # back off for one cycle, then try again
            return None
        return point_mass_window(row, [(row.first + 1) % VOCAB, (row.first + 2) % VOCAB], VOCAB)

    def observe(self, outcome: Outcome):
        self.observed.append(outcome)
        if outcome.proposer == self.name:
            self.kept[outcome.row] = outcome.accepted - 1


def setup():
    model = cyclic_lm(VOCAB)
    head = random_head("btree", N, VOCAB, seed=3, std=0.3, init_from=oracle_tables(model, N, wrong_last=True))
    return model, head


def test_a_third_proposer_drafts_greedy_windows_that_decode_exactly():
    model, head = setup()
    proposer = NextInCycle()
    decoder = SpeculativeDecoder(model, head, proposers=[proposer])
    for prompt in ([1, 3], [5, 6, 7], [0]):
        ids = torch.tensor([prompt])
        out = decoder.generate(ids, 24)
        assert torch.equal(out.sequences, PlainDecoder(model).generate(ids, 24).sequences)
        windows = out.stats.proposer_windows
        assert windows.get("next-in-cycle", 0) > 0 and windows.get("circuit", 0) > 0, windows
    assert {o.proposer for o in proposer.observed} == {"circuit", "next-in-cycle"}  # it saw every row's outcome


def test_a_third_proposer_keeps_sampling_exact():
    model, head = setup()
    joint = exact_joint(model, PROMPT, Sampling(1.0))
    gen = torch.Generator().manual_seed(4)

    def samples(decoder, count):
        return [decoder.generate(PROMPT, 3, Sampling(1.0), generator=gen).sequences[0, -3:].tolist()
                for _ in range(count)]

    right = SpeculativeDecoder(model, head, proposers=[NextInCycle()])
    assert chi_square_pvalue(samples(right, 1500), joint) > 1e-3
    wrong = SpeculativeDecoder(model, head, proposers=[NextInCycle()], acceptance=BlockResidualIsTarget())
    assert chi_square_pvalue(batched_samples(wrong, PROMPT, 1500, seed=4), joint) < 1e-6  # the control: caught


def test_prompts_of_growing_lengths_share_one_cache_allocation():
    """A compiled step specialises on its caches: prompts of 3 to 90 tokens with 20 new ones all fit the first
    allocation (powers of two), so a compiled decoder would not compile again for them."""
    model, head = setup()
    decoder = SpeculativeDecoder(model, head)
    for length in (3, 10, 25, 47, 60, 90):
        decoder.generate(torch.arange(length)[None] % VOCAB, 20)
    assert decoder.verifier.allocations == 1 and decoder.verifier.max_len == 128
