"""``PositionKVCache``: a KV cache addressed by column, as gpt-fast's ``KVCache.update``.

Each layer holds ``[batch, kv_heads, capacity, head_dim]`` keys and values allocated once. A call
writes the KV of its query tokens at the columns it names (``index_copy_`` along the sequence
axis, the same columns for every row) and attends over the first ``kv_len`` columns. Nothing is
appended, cropped or rolled back: a token that changes is fed again at its column and simply
overwrites the old KV; what a query may see is the attention mask's business
(:mod:`rpt.decode_forward.queries`), so stale or scratch columns cost nothing but being masked.

It speaks the Hugging Face ``Cache`` protocol that attention layers use (``update(key, value,
layer_idx)``), so any model whose layers call ``past_key_values.update`` can run on it.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer, DynamicSlidingWindowLayer


class PositionLayer(CacheLayerMixin):
    """One attention layer's KV, written at ``owner.columns`` and read up to ``owner.kv_len``."""

    is_compileable = True
    is_sliding = False

    def __init__(self, owner: PositionKVCache):
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads, _, k_dim = key_states.shape
        self.allocate(batch, heads, k_dim, value_states.shape[-1], key_states.dtype, key_states.device)

    def allocate(self, batch: int, heads: int, k_dim: int, v_dim: int, dtype: torch.dtype, device) -> None:
        """Zeroed K and V ``[batch, heads, capacity, dim]``: at a first call's shapes, or before it (the fused
        decode call knows them, :mod:`rpt.decode_forward.llama_forward`)."""
        shape = (batch, heads, self.owner.capacity)
        self.keys = torch.zeros(*shape, k_dim, dtype=dtype, device=device)
        self.values = torch.zeros(*shape, v_dim, dtype=dtype, device=device)
        self.dtype, self.device = dtype, torch.device(device)
        if not torch.compiler.is_compiling():  # fixed addresses, as HF's StaticLayer: what CUDA graphs need
            torch._dynamo.mark_static_address(self.keys)
            torch._dynamo.mark_static_address(self.values)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        columns = self.owner.columns
        self.keys.index_copy_(2, columns, key_states)  # a changed token overwrites its column in place
        self.values.index_copy_(2, columns, value_states)
        n = self.owner.kv_len
        if n == self.owner.capacity:  # fixed shapes (torch.compile): attend over every column, masked
            return self.keys, self.values
        return self.keys[:, :, :n], self.values[:, :, :n]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.kv_len, 0

    def get_seq_length(self) -> int:
        return self.owner.kv_len

    def get_max_length(self) -> int:
        return self.owner.capacity


class PositionKVCache(Cache):
    """KV of ``capacity`` columns per layer; set :attr:`columns` and :attr:`kv_len` before each call."""

    def __init__(self, num_layers: int, capacity: int):
        self.capacity = capacity
        self.columns = torch.zeros(0, dtype=torch.long)
        self.kv_len = 0
        super().__init__(layers=[PositionLayer(self) for _ in range(num_layers)])

    @classmethod
    def for_model(cls, model, capacity: int) -> PositionKVCache:
        """A cache for every layer of ``model``; ``ValueError`` unless each is full attention, or
        sliding-window attention whose window covers all ``capacity`` columns (then no query is ever
        farther than the window from a key it sees, and the layer computes full attention)."""
        window = sliding_window_of(model)
        if window is not None and capacity > window:
            raise ValueError(
                f"this decode needs {capacity} cache columns but the model's sliding window is {window} tokens; "
                f"lower max_new_tokens or shorten the prompts to fit the window, or use generate_reference"
            )
        return cls(model.config.get_text_config(decoder=True).num_hidden_layers, capacity)


def sliding_window_of(model) -> int | None:
    """The smallest sliding window of ``model``'s layers (None: all full attention); ``ValueError`` for
    layers that are neither (recurrent, chunked attention)."""
    probe = DynamicCache(config=model.config.get_text_config(decoder=True))
    kinds = {type(layer).__name__ for layer in probe.layers if type(layer) is not DynamicLayer}
    if kinds - {DynamicSlidingWindowLayer.__name__}:
        raise ValueError(
            f"the cached RPT decoder needs full-attention or sliding-window layers, but this model's cache has "
            f"{sorted(kinds)}; use generate_reference for recurrent or chunked-attention models"
        )
    windows = [layer.sliding_window for layer in probe.layers if type(layer) is DynamicSlidingWindowLayer]
    return min(windows) if windows else None
