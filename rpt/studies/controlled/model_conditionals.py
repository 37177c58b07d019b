"""Every conditional the window chain (:mod:`rpt.studies.controlled.window_chain`) needs, read from a model
by plain forward calls with ``position_ids`` and ``offset_ids`` (no sampler code): one packed
forward per context under a 4D mask, and the one-sequence-per-query reference it is tested
against."""

from __future__ import annotations

import itertools

import numpy as np
import torch

from rpt.studies.controlled import window_chain as wc


def _assignments(vocab: int, m: int) -> torch.Tensor:
    """All ``V**m`` token tuples, ``[V**m, m]``, last coordinate fastest (C order of ``[V] * m``)."""
    if m == 0:
        return torch.zeros(1, 0, dtype=torch.long)
    return torch.tensor(list(itertools.product(range(vocab), repeat=m)), dtype=torch.long)


@torch.no_grad()
def _last_token_probs(model, ids: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor, vocab: int,
                      batch_size: int) -> torch.Tensor:
    """Softmax over the ``vocab`` symbols of the logits at the last token of each row (float64)."""
    out = []
    for lo in range(0, len(ids), batch_size):
        logits = model(ids[lo:lo + batch_size], position_ids=positions[lo:lo + batch_size],
                       offset_ids=rows[lo:lo + batch_size], logits_to_keep=1).logits[:, -1]
        # The source never emits EOS mid-sequence: condition on "the next token is a symbol".
        out.append(torch.softmax(logits[:, :vocab].double(), dim=-1))
    return torch.cat(out)


def _query_groups(vocab: int, window: int, L: int) -> list[tuple[str, int, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The queries of every table: ``(table, j, tokens [A, m], positions [m], rows [m])``; the answer
    is the law at the group's last token. ``init[j]``: ``x_<j`` at ``L..L+j-1`` (NTP rows);
    ``resample[j]``: ``x_<j`` then ``x_{j+1..w-1}`` at ``L+j+1..`` with offset rows ``1..w-1-j``."""
    groups = []
    for j in range(1, window):
        groups.append(("init", j, _assignments(vocab, j), torch.arange(L, L + j), torch.zeros(j, dtype=torch.long)))
    for j in range(window - 1):
        m = window - 1 - j
        pos = torch.cat([torch.arange(L, L + j), torch.arange(L + j + 1, L + window)])
        rows = torch.cat([torch.zeros(j, dtype=torch.long), torch.arange(1, m + 1)])
        groups.append(("resample", j, _assignments(vocab, window - 1), pos, rows))
    return groups


def _tables(b: int, vocab: int, window: int, p0: torch.Tensor, answers: dict) -> wc.WindowConditionals:
    init = [p0.cpu().numpy()]
    for j in range(1, window):
        init.append(answers["init", j].reshape([b] + [vocab] * (j + 1)).cpu().numpy())
    resample = []
    for j in range(window - 1):
        table = answers["resample", j].reshape([b] + [vocab] * window).cpu().numpy()
        resample.append(np.moveaxis(table, -1, 1 + j))  # the new x_j onto its own axis
    resample.append(init[-1])
    return wc.WindowConditionals(init, resample)


@torch.no_grad()
def model_conditionals_reference(model, contexts: np.ndarray, window: int, vocab: int,
                                 batch_size: int = 2048) -> wc.WindowConditionals:
    """:func:`model_conditionals` written out as one full sequence per query (no mask tricks):
    context, then the group's tokens at their positions with their offset rows -- the same
    computation as the reference sampler's ``ptp_logits``. The tests' oracle; slow."""
    ctx = torch.as_tensor(contexts, dtype=torch.long, device=model.device)
    b, L = ctx.shape
    answers = {}
    for table, j, tokens, pos, rows in _query_groups(vocab, window, L):
        a, m = tokens.shape
        ids = torch.cat([ctx[:, None, :].expand(b, a, L), tokens[None].expand(b, a, m).to(ctx.device)], dim=2)
        positions = torch.cat([torch.arange(L), pos]).to(ctx.device).expand(b * a, -1)
        offsets = torch.cat([torch.zeros(L, dtype=torch.long), rows]).to(ctx.device).expand(b * a, -1)
        probs = _last_token_probs(model, ids.reshape(b * a, L + m), positions, offsets, vocab, batch_size)
        answers[table, j] = probs.reshape(b, a, vocab)
    p0 = _last_token_probs(model, ctx, torch.arange(L, device=ctx.device).expand(b, -1),
                           torch.zeros_like(ctx), vocab, batch_size)
    return _tables(b, vocab, window, p0, answers)


@torch.no_grad()
def model_conditionals(model, contexts: np.ndarray, window: int, vocab: int, batch_size: int = 64) -> wc.WindowConditionals:
    """Every conditional the window chain needs, from the model, for contexts ``[B, L]``.

    ``init[j]`` = NTP ``p(x_j | c, x_<j)``; ``resample[j]`` (``j < w-1``) = PTP-``(w-1-j)``
    ``p(x_j | c, x_<j, x_{j+1..w-1})``; ``resample[w-1]`` = ``init[w-1]``.

    One forward per context: the context, then every query group packed behind it, each at its
    own positions and offset rows, under a 4D mask in which a group sees the context and its own
    earlier tokens only -- so each answer is the full-sequence one
    (:func:`model_conditionals_reference`, tested equal), with one forward per context instead of
    one per query (1 + 2V of them for w = 2).
    """
    if getattr(model.config, "_attn_implementation", None) not in (None, "eager", "sdpa"):
        # flash-attention reads a 4D mask as a padding mask: take the slow, mask-free path.
        return model_conditionals_reference(model, contexts, window, vocab)
    ctx_all = torch.as_tensor(contexts, dtype=torch.long, device=model.device)
    n, L = ctx_all.shape
    groups = _query_groups(vocab, window, L)
    # The packed layout: token ids, positions, offset rows, group index (-1: context) per slot.
    ids, pos, rows, gid, slot_of = [], [torch.arange(L)], [torch.zeros(L, dtype=torch.long)], [torch.full((L,), -1)], []
    start, next_group = L, 0
    for _table, _j, tokens, p, r in groups:
        a, m = tokens.shape
        ids.append(tokens.reshape(-1))
        pos.append(p.repeat(a))
        rows.append(r.repeat(a))
        gid.append(torch.arange(next_group, next_group + a).repeat_interleave(m))
        slot_of.append(start + m * torch.arange(a) + m - 1)  # where each group's answer is read
        start, next_group = start + a * m, next_group + a
    queries, pos, rows, gid = torch.cat(ids), torch.cat(pos), torch.cat(rows), torch.cat(gid)
    total = L + len(queries)
    idx = torch.arange(total)
    causal = idx[None, :] <= idx[:, None]
    same_group = (gid[None, :] == gid[:, None]) & (gid[:, None] >= 0)
    allowed = causal & ((gid[None, :] < 0) | same_group)  # the context, or earlier in one's own group
    dtype = model.dtype
    mask = torch.where(allowed, torch.zeros((), dtype=dtype), torch.tensor(torch.finfo(dtype).min, dtype=dtype))
    device = ctx_all.device
    mask, pos, rows, queries = mask.to(device), pos.to(device), rows.to(device), queries.to(device)
    p0s, answers = [], {key[:2]: [] for key in groups}
    for lo in range(0, n, batch_size):
        ctx = ctx_all[lo:lo + batch_size]
        b = len(ctx)
        logits = model(torch.cat([ctx, queries.expand(b, -1)], dim=1), position_ids=pos.expand(b, -1),
                       offset_ids=rows.expand(b, -1), attention_mask=mask.expand(b, 1, -1, -1)).logits
        probs = torch.softmax(logits[..., :vocab].double(), dim=-1)  # symbols only, as above
        p0s.append(probs[:, L - 1])
        for (table, j, *_), slots in zip(groups, slot_of):
            answers[table, j].append(probs[:, slots])
    return _tables(n, vocab, window, torch.cat(p0s), {k: torch.cat(v) for k, v in answers.items()})

