"""Linear + cross-entropy over a large vocabulary without ``[batch, seq, vocab]`` logits.

``linear_cross_entropy(hidden, weight, bias, labels, chunk)`` returns the per-token float32
cross-entropy of the logits ``hidden @ weight.T + bias`` (optionally scaled and soft-capped, as
some HF heads do) -- the numbers ``F.cross_entropy(logits.float(), labels, reduction="none")``
gives -- while holding the float32 logits of only ``chunk`` tokens at a time, in one buffer
reused for every chunk (the memory plan of Liger's fused linear cross-entropy, written in
PyTorch ops so it runs on any device):

* forward: per chunk, the logits into the buffer, then in place ``exp(z - max)``; keep only the
  per-token loss and log-sum-exp (``4 N`` bytes each);
* backward: per chunk, recompute the logits into the buffer, turn them in place into
  ``softmax - onehot`` scaled by the incoming gradient; ``grad_hidden`` per chunk in the compute
  dtype (as a bf16 ``nn.Linear`` would), ``grad_weight`` as float32 products summed in float32
  and rounded once at the end (a bf16 running sum lost more with every chunk: relative error
  against float64 2.6e-3 at 1 chunk, 1.7e-2 at 256; now 2.4e-3 at any count). The float32
  product costs the weight-gradient matmul its bf16 speed on a GPU.

The price is one extra ``hidden @ W.T`` per token (2 H V FLOPs) for the recomputation, paid
only when the tokens need more than one chunk (a single chunk keeps its softmax instead). The
weight is read directly, outside the head module's forward, so under DeepSpeed ZeRO-3 it must
be registered as an external parameter of the module that calls this (``rpt.training`` does).
"""

from __future__ import annotations

import torch

from rpt.objective import IGNORE_INDEX


def chunk_tokens(vocab_size: int, budget_bytes: int) -> int:
    """Tokens per chunk so one float32 ``[chunk, vocab]`` buffer fits in ``budget_bytes``."""
    return max(1, budget_bytes // (4 * vocab_size))


def _logits_into(buf: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, bias, scale, softcap) -> torch.Tensor:
    """``buf[:len(h)]`` := the chunk's float32 logits (after bias, scale and soft-cap)."""
    z = buf[: h.shape[0]]
    if h.dtype == torch.float32:
        torch.mm(h, weight.t(), out=z)
    else:
        z.copy_(h @ weight.t())  # a bf16 / fp16 product, upcast into the float32 buffer
    if bias is not None:
        z.add_(bias.float())
    if scale is not None:
        z.mul_(scale)
    if softcap is not None:
        z.div_(softcap).tanh_().mul_(softcap)
    return z


class LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, chunk: int, scale, softcap):
        n, vocab = hidden.shape[0], weight.shape[0]
        valid = labels != IGNORE_INDEX
        target = labels.masked_fill(~valid, 0)
        losses = torch.zeros(n, dtype=torch.float32, device=hidden.device)
        lse = torch.zeros_like(losses)
        buf = torch.empty(min(chunk, n), vocab, dtype=torch.float32, device=hidden.device)
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            z = _logits_into(buf, hidden[s:e], weight, bias, scale, softcap)
            picked = z.gather(1, target[s:e, None]).squeeze(1)
            top = z.amax(dim=1)
            total = z.sub_(top[:, None]).exp_().sum(dim=1)
            lse[s:e] = top + total.log()
            losses[s:e] = torch.where(valid[s:e], lse[s:e] - picked, torch.zeros_like(picked))
        ctx.save_for_backward(hidden, weight, bias, target, valid, lse)
        ctx.chunk, ctx.scale, ctx.softcap = chunk, scale, softcap
        # One chunk holds every token: keep its softmax (no larger than the buffer) rather than
        # recompute it in the backward pass.
        ctx.probs = z.div_(total[:, None]) if n <= chunk and softcap is None else None
        return losses

    @staticmethod
    def backward(ctx, grad_losses):
        hidden, weight, bias, target, valid, lse = ctx.saved_tensors
        chunk, scale, softcap = ctx.chunk, ctx.scale, ctx.softcap
        n, vocab = hidden.shape[0], weight.shape[0]
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        # float32 whatever the compute dtype (one float32 copy of the head's weight, transient):
        # a bf16 running sum rounded again at every chunk.
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(vocab, dtype=torch.float32, device=hidden.device) if need_b else None
        g = grad_losses.float() * valid
        capped = None
        buf = None if ctx.probs is not None else torch.empty(min(chunk, n), vocab, dtype=torch.float32, device=hidden.device)
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            if ctx.probs is not None:
                p = ctx.probs
            else:
                z = _logits_into(buf, hidden[s:e], weight, bias, scale, softcap)
                capped = 1 - (z / softcap) ** 2 if softcap is not None else None  # d tanh-cap / d input
                p = z.sub_(lse[s:e, None]).exp_()  # softmax, in place
            p[torch.arange(e - s, device=p.device), target[s:e]] -= 1.0
            p.mul_(g[s:e, None])  # d loss / d logits
            if capped is not None:
                p.mul_(capped)
            if scale is not None:
                p.mul_(scale)
            if grad_b is not None:
                grad_b += p.sum(dim=0)
            if grad_h is not None:  # the compute-dtype copy of p only where grad_h needs it
                torch.mm(p if p.dtype == hidden.dtype else p.to(hidden.dtype), weight, out=grad_h[s:e])
            if grad_w is not None:  # float32 operands: p is float32 already, the chunk's hidden is small
                grad_w.addmm_(p.t(), hidden[s:e].float())
        ctx.probs = None
        if grad_b is not None:
            grad_b = grad_b.to(bias.dtype)
        if grad_w is not None:
            grad_w = grad_w.to(weight.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor, chunk: int,
    scale: float | None = None, softcap: float | None = None,
) -> torch.Tensor:
    """Per-token float32 CE (0 where ``labels`` is -100) of ``hidden @ weight.T + bias``.

    ``hidden``: ``[N, H]``; ``labels``: ``[N]``. Under autocast the products run in the autocast
    dtype, as an autocast ``nn.Linear`` would; otherwise in ``weight``'s dtype.
    """
    device_type = hidden.device.type
    dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else weight.dtype
    with torch.autocast(device_type, enabled=False):
        return LinearCrossEntropy.apply(hidden.to(dtype), weight.to(dtype), bias, labels, chunk, scale, softcap)
