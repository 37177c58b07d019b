"""``ProposalLayout``'s named columns against the proposals they name: each named part of
``block_proposals``' output equals the :class:`~rpt.sampling.proposals.Proposer` call that proposal is
by definition (NTP for n + 1 over the fed token, NTP for n, PTP per lag), on the device tensor and on
a host row."""

import pytest
import torch

from rpt.sampling import SamplingConfig
from rpt.sampling.decode.contexts import GrowingContexts
from rpt.sampling.decode.proposal_layout import ProposalLayout
from rpt.sampling.proposals import Proposer, block_proposals

V = 50


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize(("keep_top", "keep_prev"), [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("lags", [(), (1,), (1, 2, 3)])
def test_named_columns_hold_the_proposals_they_name(temperature, keep_top, keep_prev, lags):
    cfg = SamplingConfig(temperature=temperature, rpt_iters=2, confidence=0.05, repetition_penalty=1.3, seed=1)
    batch, n = 3, 9
    gen = torch.Generator().manual_seed(len(lags) + 2 * keep_top + keep_prev)
    seqs = torch.randint(0, V, (batch, 16), generator=gen)
    proposer = Proposer(cfg, 4, torch.tensor([11, 12, 13]))
    logits = torch.randn(batch, keep_top + keep_prev + len(lags), V, generator=gen) * 3
    fed = torch.randint(0, V, (batch,), generator=gen)
    position = torch.tensor([7, 5, 9])  # each row's position of column n (any: it keys the draws)
    its = torch.randint(0, 3, (len(lags), batch), generator=gen) if lags else None
    layout = ProposalLayout(proposer.ntp_draws, keep_top, keep_prev, lags)
    vals = block_proposals(GrowingContexts(proposer, seqs), logits.clone(), n, position, fed, layout, its)

    assert vals.shape == (batch, layout.width)
    assert not vals[:, layout.flag].any()
    at = 0
    if keep_top:
        want = proposer.ntp(torch.cat([seqs[:, :n], fed[:, None]], 1), logits[:, at].clone(), position + 1)
        assert torch.equal(vals[:, layout.top], want)
        at += 1
    if keep_prev:
        assert torch.equal(vals[:, layout.prev], proposer.ntp(seqs[:, :n], logits[:, at].clone(), position))
        at += 1
    assert vals[:, layout.top].shape[1] == proposer.ntp_draws * keep_top
    assert vals[:, layout.prev].shape[1] == proposer.ntp_draws * keep_prev
    if not lags:
        return
    tokens, accepted = layout.chain_columns(vals)
    for i, lag in enumerate(lags):
        want_tokens, want_accepted = proposer.ptp(seqs[:, :n - lag], logits[:, at + i].clone(), position, its[i], lag)
        assert torch.equal(tokens[:, i], want_tokens) and torch.equal(accepted[:, i], want_accepted)
        for b, row in enumerate(vals.tolist()):
            assert layout.answers(row)[lag] == (int(want_tokens[b]), bool(want_accepted[b]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_greedy_acceptance_is_the_softmax_at_the_argmax_against_a_float64_oracle(dtype):
    """greedy PTP's (token, p > confidence) without a softmax buffer, against softmax in float64;
    rows built so that the argmax's probability sits on both sides of the thresholds."""
    from rpt.sampling.proposals import greedy_acceptance

    g = torch.Generator().manual_seed(0)
    scores = (torch.randn(64, 300, generator=g, dtype=torch.float64) * torch.linspace(0.1, 8, 64)[:, None]).to(dtype)
    want_p = torch.softmax(scores.double(), -1)
    want_tok = want_p.argmax(-1)
    for confidence in (0.05, 0.5, 0.9):
        tokens, accepted = greedy_acceptance(scores.clone(), confidence)
        assert torch.equal(tokens, want_tok)
        p = want_p.gather(-1, want_tok[:, None])[:, 0]
        clear = (p - confidence).abs() > 1e-5  # away from the threshold, float rounding cannot flip it
        assert torch.equal(accepted[clear], (p > confidence)[clear])
        assert clear.sum() > 50 and 0 < accepted.sum() < 64
