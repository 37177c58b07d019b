"""Linear + cross-entropy over a large vocabulary without ``[batch, seq, vocab]`` logits.

``linear_cross_entropy(hidden, weight, bias, labels, blocks)`` returns the per-token float32
cross-entropy of the logits ``hidden @ weight.T + bias`` (optionally scaled and soft-capped, as
some HF heads do) -- the numbers ``F.cross_entropy(logits.float(), labels, reduction="none")``
gives -- while holding the float32 logits of only one ``[token block, vocab block]`` tile at a
time, in one buffer reused for every tile (:func:`plan_blocks` sizes the tile from a byte budget).

The tiles run **over the vocabulary** (all tokens, a slice of the head's rows), so that each GEMM
is large and each slice of the head's weight gradient is formed by one product over every token:

* forward: per vocabulary block, the logits into the buffer, then an online log-sum-exp (running
  max and sum per token, as flash attention does over keys); keep only the per-token loss and
  log-sum-exp (``4 N`` bytes each);
* backward: per vocabulary block, recompute the logits, turn them in place into ``softmax -
  onehot`` scaled by the incoming gradient; then ``grad_weight[block] = p.T @ hidden`` in one
  GEMM in the compute dtype (bf16 operands on the tensor cores, float32 accumulation inside the
  GEMM, rounded once), and ``grad_hidden += p @ weight[block]`` summed in float32 over blocks.

Only when the tokens are so many that even a :data:`MIN_VOCAB_BLOCK`-row tile exceeds the budget
are they split into token blocks too; then each weight-gradient slice is summed in float32 over
those (few, large) token blocks. The price is one extra ``hidden @ W.T`` per token (2 H V FLOPs)
for the recomputation, paid only when there is more than one tile (a single tile keeps its
softmax instead). The weight is read directly, outside the head module's forward, so under
DeepSpeed ZeRO-3 it must be registered as an external parameter of the module that calls this
(``rpt.training`` does).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from rpt.model.objective import IGNORE_INDEX

# The narrowest vocabulary slice a tile takes before the tokens are split instead: a GEMM this wide
# still runs near the tensor cores' peak, a narrower one would not.
MIN_VOCAB_BLOCK = 512
# Vocabulary slices start at multiples of this many rows, so every bf16 slice of the weight is
# aligned for the tensor cores.
VOCAB_ALIGN = 128


class Blocks(NamedTuple):
    """A tile of the ``[tokens, vocab]`` logits: ``tokens`` rows of ``hidden`` by ``vocab`` rows of the head."""

    tokens: int
    vocab: int


def plan_blocks(n_tokens: int, vocab_size: int, budget_bytes: int) -> Blocks:
    """The largest tile whose float32 logits fit in ``budget_bytes``: every token and as many vocabulary
    rows as fit (a multiple of :data:`VOCAB_ALIGN`), or, when fewer than :data:`MIN_VOCAB_BLOCK`
    rows would fit, :data:`MIN_VOCAB_BLOCK` rows and as many tokens as fit."""
    n_tokens = max(1, n_tokens)
    rows = budget_bytes // (4 * n_tokens)
    if rows >= vocab_size:
        return Blocks(n_tokens, vocab_size)
    if rows >= MIN_VOCAB_BLOCK:
        return Blocks(n_tokens, rows // VOCAB_ALIGN * VOCAB_ALIGN)
    vocab = min(vocab_size, MIN_VOCAB_BLOCK)
    return Blocks(max(1, min(n_tokens, budget_bytes // (4 * vocab))), vocab)


def _logits_into(buf: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, bias, scale, softcap) -> torch.Tensor:
    """``buf[:len(h), :len(weight)]`` := the tile's float32 logits (after bias, scale and soft-cap)."""
    z = buf[: h.shape[0], : weight.shape[0]]
    if h.dtype == torch.float32:
        torch.mm(h, weight.t(), out=z)
    else:
        z.copy_(h @ weight.t())  # a bf16 / fp16 product (as an autocast nn.Linear), upcast into the buffer
    if bias is not None:
        z.add_(bias.float())
    if scale is not None:
        z.mul_(scale)
    if softcap is not None:
        z.div_(softcap).tanh_().mul_(softcap)
    return z


def _tile_buffer(blocks: Blocks, n: int, vocab: int, device) -> torch.Tensor:
    """The one float32 buffer every tile's logits are computed into."""
    return torch.empty(min(blocks.tokens, n), min(blocks.vocab, vocab), dtype=torch.float32, device=device)


def _spans(total: int, size: int):
    return [(s, min(total, s + size)) for s in range(0, total, size)]


def _target_in_block(target: torch.Tensor, v0: int, v1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Whether each token's target lies in vocabulary rows ``v0:v1``, and its column there (0 if not)."""
    inside = (target >= v0) & (target < v1)
    return inside, torch.where(inside, target - v0, torch.zeros_like(target))


class LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, blocks: Blocks, scale, softcap):
        n, vocab = hidden.shape[0], weight.shape[0]
        valid = labels != IGNORE_INDEX
        target = labels.masked_fill(~valid, 0)
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        picked = torch.zeros_like(lse)
        buf = _tile_buffer(blocks, n, vocab, hidden.device)
        token_spans, vocab_spans = _spans(n, blocks.tokens), _spans(vocab, blocks.vocab)
        for t0, t1 in token_spans:
            h, tgt = hidden[t0:t1], target[t0:t1]
            run_max = torch.full((t1 - t0,), float("-inf"), dtype=torch.float32, device=hidden.device)
            run_sum = torch.zeros_like(run_max)
            for v0, v1 in vocab_spans:
                z = _logits_into(buf, h, weight[v0:v1], None if bias is None else bias[v0:v1], scale, softcap)
                inside, col = _target_in_block(tgt, v0, v1)
                picked[t0:t1] += z.gather(1, col[:, None]).squeeze(1) * inside
                new_max = torch.maximum(run_max, z.amax(dim=1))
                # Online log-sum-exp: rescale the sum so far to the new max (exp(-inf) = 0 at the start).
                run_sum = run_sum * torch.exp(run_max - new_max) + z.sub_(new_max[:, None]).exp_().sum(dim=1)
                run_max = new_max
            lse[t0:t1] = run_max + run_sum.log()
        losses = torch.where(valid, lse - picked, torch.zeros_like(lse))
        ctx.save_for_backward(hidden, weight, bias, target, valid, lse)
        ctx.blocks, ctx.scale, ctx.softcap = blocks, scale, softcap
        # One tile holds every logit: keep its softmax (no larger than the buffer) rather than
        # recompute it in the backward pass.
        one_tile = len(token_spans) == 1 and len(vocab_spans) == 1
        ctx.probs = z.div_(run_sum[:, None]) if one_tile and softcap is None else None
        return losses

    @staticmethod
    def backward(ctx, grad_losses):
        hidden, weight, bias, target, valid, lse = ctx.saved_tensors
        blocks, scale, softcap = ctx.blocks, ctx.scale, ctx.softcap
        n, vocab = hidden.shape[0], weight.shape[0]
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        token_spans, vocab_spans = _spans(n, blocks.tokens), _spans(vocab, blocks.vocab)
        # Each weight-gradient slice is one GEMM over every token, written once in the compute dtype;
        # only several token blocks need a float32 sum of their products (one rounding, at the end).
        sum_w = need_w and len(token_spans) > 1
        grad_w = None
        if need_w:
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if sum_w else torch.empty_like(weight)
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_b = torch.zeros(vocab, dtype=torch.float32, device=hidden.device) if need_b else None
        g = grad_losses.float() * valid
        buf = _tile_buffer(blocks, n, vocab, hidden.device) if ctx.probs is None else None
        for t0, t1 in token_spans:
            h, tgt = hidden[t0:t1], target[t0:t1]
            rows = torch.arange(t1 - t0, device=hidden.device)
            # grad_hidden sums a product per vocabulary block: in float32 (one rounding, at the end),
            # in place when grad_hidden is float32 itself, else in a float32 buffer copied at the end.
            acc_h = None
            if need_h and len(vocab_spans) > 1:
                acc_h = grad_h[t0:t1].zero_() if hidden.dtype == torch.float32 else torch.zeros(
                    t1 - t0, hidden.shape[1], dtype=torch.float32, device=hidden.device)
            for v0, v1 in vocab_spans:
                w = weight[v0:v1]
                capped = None
                if ctx.probs is not None:
                    p = ctx.probs
                else:
                    z = _logits_into(buf, h, w, None if bias is None else bias[v0:v1], scale, softcap)
                    capped = 1 - (z / softcap) ** 2 if softcap is not None else None  # d tanh-cap / d input
                    p = z.sub_(lse[t0:t1, None]).exp_()  # softmax, in place
                inside, col = _target_in_block(tgt, v0, v1)
                p[rows, col] -= inside.to(p.dtype)
                p.mul_(g[t0:t1, None])  # d loss / d logits
                if capped is not None:
                    p.mul_(capped)
                if scale is not None:
                    p.mul_(scale)
                if grad_b is not None:
                    grad_b[v0:v1] += p.sum(dim=0)
                # The compute-dtype copy of p: bf16 operands put both products on the tensor cores.
                pc = p if p.dtype == hidden.dtype else p.to(hidden.dtype)
                if need_h:
                    if acc_h is None:
                        torch.mm(pc, w, out=grad_h[t0:t1])
                    elif acc_h.dtype == pc.dtype:
                        acc_h.addmm_(pc, w)
                    else:
                        acc_h += pc @ w  # the block's product in the compute dtype, summed in float32
                if need_w:
                    if not sum_w:
                        torch.mm(pc.t(), h, out=grad_w[v0:v1])
                    elif pc.dtype == torch.float32:
                        grad_w[v0:v1].addmm_(pc.t(), h)
                    else:
                        grad_w[v0:v1] += pc.t() @ h
            if acc_h is not None and hidden.dtype != torch.float32:
                grad_h[t0:t1] = acc_h
        ctx.probs = None
        if grad_b is not None:
            grad_b = grad_b.to(bias.dtype)
        if grad_w is not None:
            grad_w = grad_w.to(weight.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
    blocks: Blocks | tuple[int, int], scale: float | None = None, softcap: float | None = None,
) -> torch.Tensor:
    """Per-token float32 CE (0 where ``labels`` is -100) of ``hidden @ weight.T + bias``.

    ``hidden``: ``[N, H]``; ``labels``: ``[N]``; ``blocks``: the ``(tokens, vocab)`` tile of
    float32 logits held at a time (:func:`plan_blocks`). Under autocast the products run in the
    autocast dtype, as an autocast ``nn.Linear`` would; otherwise in ``weight``'s dtype.
    """
    tokens, vocab = blocks
    if tokens < 1 or vocab < 1:
        raise ValueError(f"blocks must be positive (tokens, vocab) sizes, got {tuple(blocks)}")
    device_type = hidden.device.type
    dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else weight.dtype
    with torch.autocast(device_type, enabled=False):
        return LinearCrossEntropy.apply(hidden.to(dtype), weight.to(dtype), bias, labels, Blocks(int(tokens), int(vocab)),
                                        scale, softcap)
