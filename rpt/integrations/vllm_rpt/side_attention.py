r"""The PTP chains' attention inside a vLLM step, through the layer's own CPU attention kernel.

The stock attention call of a layer writes every row's K/V to its slot and attends causally over
slots, which is right for the NTP rows (the re-fed token and the tail). A chain of lag ``l`` ending
at the newest position ``n`` must instead see the columns ``0 .. n-l-1`` (before the token it may
replace) and its own earlier tokens (:mod:`rpt.decode_forward.visibility`'s rule). After the stock call
the chain's K/V are written again into the slots ``n-l .. n-1``: then a causal read of ``n`` slots
with the chain's ``l`` queries at the end sees exactly that (query ``m`` reads the slots up to
``n - l + m``). The kernel runs once per lag (lags in increasing order: a larger lag overwrites only
slots a smaller one no longer reads), over all requests' chains of that lag as virtual requests.

Overwriting the tail's slots ``>= n-l`` is safe: the NTP rows of this layer have been computed,
the other layers have their own caches, and the engine re-feeds every slot from the first tentative
token on in the next step (the tokens in those slots are never final, :mod:`.driver`), so no later
step and no prefix-cache block reads them.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from rpt.integrations.vllm_rpt.codes import chain_code


@dataclass(frozen=True)
class Chains:
    """One lag's chains in a step: the flat row indices (``l`` per chain), each chain's request index
    in the step's batch, and its newest position ``n``."""

    lag: int
    rows: torch.Tensor
    requests: list[int]
    newest: list[int]


_CURRENT: list[Chains] | None = None


@contextmanager
def chains_of_step(chains: list[Chains] | None):
    """Make ``chains`` the current step's for the attention layers (None: a step without chains)."""
    global _CURRENT
    previous, _CURRENT = _CURRENT, chains
    try:
        yield
    finally:
        _CURRENT = previous


def current_chains() -> list[Chains] | None:
    return _CURRENT


def find_chains(codes: torch.Tensor, true_positions: torch.Tensor, query_start_loc: torch.Tensor) -> list[Chains]:
    """The chains of a step from its rows' codes (0: an NTP row) and true positions, by lag."""
    nonzero = codes.nonzero()[:, 0]
    if nonzero.numel() == 0:
        return []
    rows, values = nonzero.tolist(), codes[nonzero].tolist()
    positions = true_positions[nonzero].tolist()
    starts = query_start_loc.tolist()
    by_lag: dict[int, tuple[list[int], list[int], list[int]]] = {}
    for row, code, position in zip(rows, values, positions):
        lag = int((1 + (8 * (code - 1) + 1) ** 0.5) / 2)  # the l with l(l-1)/2 < code <= l(l+1)/2
        if code != chain_code(lag, 0):
            continue  # not a chain's first token
        flat, requests, newest = by_lag.setdefault(lag, ([], [], []))
        flat.extend(range(row, row + lag))
        requests.append(next(r for r in range(len(starts) - 1) if starts[r] <= row < starts[r + 1]))
        newest.append(position + lag - 1)
    return [Chains(lag, torch.tensor(flat), req, new) for lag, (flat, req, new) in sorted(by_lag.items())]


def redo_chain_rows(attn, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, output: torch.Tensor,
                    chains: list[Chains]) -> torch.Tensor:
    """``output`` (``[rows, heads * head_dim]``) with the chain rows attended under RPT's rule."""
    from vllm import _custom_ops as ops  # late: vLLM's compiled ops load with the engine
    from vllm import envs
    from vllm.forward_context import get_forward_context
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadata

    metadata = get_forward_context().attn_metadata
    if isinstance(metadata, list):
        metadata = metadata[0]
    meta = metadata[attn.layer_name] if isinstance(metadata, dict) else metadata
    impl, cache = attn.impl, attn.kv_cache
    block = cache.shape[2]
    heads, kv_heads, dim = impl.num_heads, impl.num_kv_heads, impl.head_size
    q, k, v = query.view(-1, heads, dim), key.view(-1, kv_heads, dim), value.view(-1, kv_heads, dim)
    output = output.clone()
    for c in chains:
        count = len(c.requests)
        tables = meta.block_table[torch.tensor(c.requests)]
        slots = torch.tensor([n - c.lag + m for n in c.newest for m in range(c.lag)])
        owner = torch.arange(count).repeat_interleave(c.lag)
        physical = tables[owner, slots // block].long() * block + slots % block
        impl.do_kv_cache_update(attn, k[c.rows], v[c.rows], cache, physical)
        starts = torch.arange(0, (count + 1) * c.lag, c.lag, dtype=torch.int32)
        seq_lens = torch.tensor(c.newest, dtype=torch.int32)
        schedule = ops.cpu_attn_get_scheduler_metadata(
            num_reqs=count, num_heads=heads, num_kv_heads=kv_heads, head_dim=dim, seq_lens=seq_lens,
            dtype=query.dtype, query_start_loc=starts, causal=True, sliding_window_size=-1, isa=attn.isa,
            enable_kv_split=envs.VLLM_CPU_ATTN_SPLIT_KV, kv_cache_dtype=impl.kv_cache_dtype)
        virtual = CPUAttentionMetadata(
            num_actual_tokens=len(slots), max_query_len=c.lag, query_start_loc=starts, max_seq_len=max(c.newest),
            seq_lens=seq_lens, block_table=tables, slot_mapping=physical, scheduler_metadata=schedule, causal=True)
        out = torch.empty(len(slots), heads, dim, dtype=output.dtype)
        impl.forward(attn, q[c.rows], k[c.rows], v[c.rows], cache, virtual, out)
        output[c.rows] = out.view(len(slots), -1)
    return output
