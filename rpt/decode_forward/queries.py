r"""``ModelQueries``: logits of query tokens against a position-addressed KV cache.

The one primitive beside :class:`~rpt.model.RPTForCausalLM` that the RPT decoder, the error
analysis and the decode benchmark use. A call feeds, per row, query tokens with their positions
and offset rows (0 = NTP, ``l`` = PTP-l, eq. 8), writes their KV at given cache columns
(:class:`~rpt.decode_forward.kv_cache.PositionKVCache`) and returns logits. What each query may see is a
:class:`~rpt.decode_forward.visibility.Visibility` (eq. 4's masks, stated once in :mod:`rpt.decode_forward.visibility`).

**The model call.** A Llama-shaped model (:mod:`rpt.decode_forward.llama_forward`) runs the decode's own call: fused
QKV and gate/up projections on a stacked copy of their weights the call owns (refilled from the
parameters at every decode), attention on the cache's KV heads without copies, and the visibility rule evaluated inside flex attention's kernel in
compiled CUDA calls (a boolean mask for sdpa elsewhere); the eager and compiled decodes run that one
call. Any other model runs its own Hugging Face forward with the mask in the format its attention
takes (a boolean ``[batch, 1, Q, kv_len]`` mask for sdpa, an additive float one for eager attention);
``flex_attention`` and ``flash_attention_2/3`` (which read a 4D mask as a padding mask, or need a
``BlockMask``) run the calls that carry a custom mask with ``sdpa``, switched for the call and back (a
``plain`` call, which has none, keeps the model's own kernel); anything else is a ``ValueError`` naming
the implementation and ``sdpa``.

``compile=True`` compiles the model call with fixed shapes: the cache is read whole (``kv_len =
capacity``, its capacity rounded up by :func:`capacity_bucket`) and the query block is padded to a
power-of-two bucket, so a run over prompts of many widths compiles a bounded set of graphs (per
capacity bucket, one per query bucket) -- the prefill included, whose block fits the cache.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from rpt.decode_forward.compile_guard import dynamo_patch, guarded
from rpt.decode_forward.kv_cache import PositionKVCache, sliding_window_of
from rpt.decode_forward.llama_forward import DecodeModel
from rpt.decode_forward.visibility import Visibility, visibility_mask  # noqa: F401  (Visibility: re-exported, the calls' type)
from rpt.shared_switch import switched

EXACT_IMPLEMENTATIONS = ("sdpa", "eager")
STEP_QUERIES = 8  # the most queries a decode step's call pads without a host check (the last 7 columns are free)
# dynamo's recompile limit for the compiled model call: 7 capacity buckets (64 .. 4096) x the query buckets
# a run meets (4 of a step, a few of its prefills) x the batch buckets it meets (an evaluation's batch and its
# last ones). Past it (every batch bucket at every capacity) the graph too many is a compile failure: that
# decode runs eagerly, warned (rpt.decode_forward.compile_guard); dynamo's own cap of 256 graphs a function stays above it
COMPILED_GRAPHS = 192


def compiled_call_settings() -> contextlib.AbstractContextManager:
    """Dynamo's settings while a compiled model call traces and runs: the recompile limit
    :data:`COMPILED_GRAPHS`, and guards on the modules' hooks (dynamo skips them by default: a hook added
    after a compiled call would never run in it)."""
    return dynamo_patch(recompile_limit=COMPILED_GRAPHS, skip_nnmodule_hook_guards=False)


def implementation_of(model) -> str:
    config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    return str(getattr(config, "_attn_implementation", None) or "eager")


def _configs(model) -> list:
    """Every config object a submodule reads its attention implementation from."""
    seen: dict[int, object] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation_internal"):
            seen.setdefault(id(config), config)
            for key in getattr(config, "sub_configs", {}):
                sub = getattr(config, key, None)
                if sub is not None and hasattr(sub, "_attn_implementation_internal"):
                    seen.setdefault(id(sub), sub)
    return list(seen.values())


def check_attention(model) -> str | None:
    """The implementation to run custom-mask calls with: None (the model's own), or ``"sdpa"``.

    ``ValueError`` (naming the implementation and ``sdpa``) for one that cannot be made exact.
    """
    impl = implementation_of(model)
    if impl in EXACT_IMPLEMENTATIONS:
        return None
    if impl == "flex_attention" or "flash" in impl:
        return "sdpa"  # these read a 4D float mask as padding, or want a BlockMask: run the call with sdpa
    raise ValueError(
        f"attention implementation {impl!r} cannot take the custom 4D attention masks of RPT's queries; "
        f"load the model with attn_implementation='sdpa' (or 'eager'), e.g. model.set_attn_implementation('sdpa')"
    )


def attention_implementation(model, impl: str | None) -> contextlib.AbstractContextManager:
    """Run the body with ``impl`` set on every config of ``model`` (None: unchanged), then restore. The
    configs are the model's, shared by every caller: two threads' calls overlapping switch them once
    and restore them once, when the last one leaves (:mod:`rpt.shared_switch`); a plain call of another
    thread meanwhile runs ``impl`` (sdpa: the same tokens as the model's own kernel, tested)."""
    if impl is None:
        return contextlib.nullcontext()

    def switch() -> list:
        configs = _configs(model)
        saved = [(c, c._attn_implementation_internal) for c in configs]
        for c in configs:
            c._attn_implementation_internal = impl
        return saved

    def restore(saved: list) -> None:
        for c, old in saved:
            c._attn_implementation_internal = old

    return switched(("attn_implementation", id(model), impl), switch, restore)


def capacity_bucket(needed: int, ceiling: int | None = None) -> int:
    """The cache capacity a compiled decode allocates for ``needed`` columns: the next power of two
    (at least 64), at most ``ceiling`` (a sliding window) when ``needed`` fits under it. Shapes are
    static under compile, so every distinct capacity is a graph per query bucket; rounded, decodes of
    many prompt widths share a handful of capacities and never reach dynamo's recompile limit (as
    gpt-fast allocates ``max_seq_length`` once)."""
    size = 64
    while size < needed:
        size *= 2
    return min(size, ceiling) if ceiling is not None and needed <= ceiling else size


def batch_bucket(batch: int) -> int:
    """The rows a compiled decode of ``batch`` rows runs (the others inert, :meth:`DecodeState.load
    <rpt.sampling.decode.state.DecodeState.load>`): 1, 2, 4, 8, then four sizes per doubling (10, 12, 14,
    16, 20, 24, 28, 32, 40, ...). Every distinct batch is a graph per step, so an evaluation whose last
    batches vary would compile without end (dynamo's recompile limit); bucketed, batches up to 64 compile
    16 sizes, up to 1024 32 (four per doubling), each past 8 padded by at most a quarter (vLLM captures
    CUDA graphs at such sizes too: an extra row of a memory-bound step costs little)."""
    if batch <= 8:
        return bucket(batch)
    step = bucket(batch) // 8  # a quarter of the largest power of two below batch
    return -(-batch // step) * step


def bucket(q: int) -> int:
    """The smallest power of two >= ``q``: the padded query count of a compiled call (fixed shapes)."""
    size = 1
    while size < q:
        size *= 2
    return size


class ModelQueries:
    """A model, a :class:`PositionKVCache` of ``capacity`` columns, and calls on them.

    Args:
        model: an :class:`~rpt.model.RPTForCausalLM` (offset rows) or any HF causal LM (NTP only).
        capacity: cache columns; a call writing at column c needs ``c < capacity`` (with ``compile``,
            ``c < capacity - 7``: the last columns take the padding queries of a bucket).
        compile: compile the model call for fixed shapes (queries padded to a power-of-two bucket, the
            whole cache attended); a call of more than :data:`STEP_QUERIES` queries (a prefill) compiles
            where its padded block fits below the cache's end (one host read of its columns), else it runs
            eagerly; ``compile_max_queries`` (None: no bound) runs larger calls eagerly.
            ``compile_backend``: the ``torch.compile`` backend.
    """

    def __init__(self, model, capacity: int, *, compile: bool = False, compile_max_queries: int | None = None,
                 compile_backend: str = "inductor"):
        self.model = model
        self.switch = check_attention(model)
        self.bool_mask = (self.switch or implementation_of(model)) == "sdpa"
        if compile:
            capacity = capacity_bucket(capacity, sliding_window_of(model))
        self.cache = PositionKVCache.for_model(model, capacity)
        self.capacity = capacity
        self.dtype = model.dtype
        self.device = next(model.parameters()).device
        self._zero = torch.zeros((), dtype=self.dtype, device=self.device)
        self._neg = torch.full((), torch.finfo(self.dtype).min, dtype=self.dtype, device=self.device)
        self.takes_offsets = hasattr(model, "offset_embedding")
        self.compile_max_queries = compile_max_queries
        # a failure while compiling or running it raises CompileFailure: generate decodes eagerly instead
        self._compiled = (guarded(torch.compile(self._compiled_step, dynamic=False, backend=compile_backend))
                          if compile else None)
        # the fused call (None: the model's own forward runs), built at the first call or decode
        self.decode: DecodeModel | None = None
        self.epoch = 0  # counts the fused calls built anew (a module replaced, a hook added or removed, ...)
        # check the fused call against the model before every call (refresh); a decode turns it off and syncs
        # once at its start instead (sync): the check walks every module (3.6 ms for 16 layers at load 10, measured)
        self.check_each_call = True
        self.calls = 0

    def refresh(self) -> None:
        """Check the fused call against the model before a call (:meth:`__call__` does, unless
        :attr:`check_each_call` is off: a decode's calls, after its :meth:`sync`): built anew where anything it follows changed
        (:meth:`~rpt.decode_forward.llama_forward.DecodeModel.current`: a module replaced, a hook added, an
        attention attribute changed), its copies refilled where a weight's fingerprint changed (an
        optimizer step, ``load_state_dict``, ``p.data = t``, ``model.to(...)``)."""
        if self.decode is None or not self.decode.current():
            self._set(DecodeModel.for_model(self.model))

    def sync(self) -> None:
        """:meth:`refresh`, with the copies refilled from the parameters whatever their fingerprint says: once
        per decode, before its first call (the decode's calls then check nothing more: the model is not
        changed in the middle of a ``generate``) (an in-place write through ``p.data``, as PEFT's merge makes, leaves
        no trace a fingerprint can see)."""
        if self.decode is None or not self.decode.sync():
            self._set(DecodeModel.for_model(self.model, force=True))

    def _set(self, decode: DecodeModel | None) -> None:
        if decode is not self.decode:
            self.decode, self.epoch = decode, self.epoch + 1

    @property
    def _fused(self) -> DecodeModel | None:
        """The fused call, where it runs: not under autograd (its stacked weights are not the parameters
        autograd differentiates; a call that records a graph runs the model's forward)."""
        return None if torch.is_grad_enabled() else self.decode

    @property
    def _switch(self) -> str | None:
        return self.switch if self._fused is None else None  # the fused call attends by itself

    def mask(self, vis: Visibility, columns: torch.Tensor, kv_len: int) -> torch.Tensor:
        """The ``[batch or 1, 1, Q, kv_len]`` mask: boolean for sdpa, additive (0 / -inf-ish) for eager."""
        allowed = visibility_mask(vis, columns, kv_len)[:, None]
        if self.bool_mask:
            return allowed
        return torch.where(allowed, self._zero, self._neg)

    def _forward(self, ids, positions, offsets, vis: Visibility, columns, keep, plain: bool = False):
        """The model call: the fused decode call, or the model's own forward with its mask."""
        self.cache.columns = columns
        fused = self._fused
        if fused is not None:
            return fused(self.cache, ids, positions, offsets, vis, columns, keep, plain)
        mask = None if plain else self.mask(vis, columns, self.cache.kv_len)
        kwargs = dict(position_ids=positions, attention_mask=mask, past_key_values=self.cache, use_cache=True)
        if offsets is not None:
            # the decoder builds the offset rows in range; the model's check would read the device every call
            kwargs["offset_ids"], kwargs["check_offsets"] = offsets, False
        if keep is not None:
            kwargs["logits_to_keep"] = keep
        return self.model(ids, **kwargs).logits

    def _compiled_step(self, ids, positions, offsets, limit, start, since, columns, keep):
        """:meth:`_forward` with the visibility as tensors: the function ``compile=True`` compiles."""
        return self._forward(ids, positions, offsets, Visibility(limit, start, since), columns, keep)

    @contextlib.contextmanager
    def whole_cache_calls(self) -> Iterator[None]:
        """Around a compiled decode step that calls :meth:`whole_cache_step` inside its own graph: counts
        the call, sets the attention implementation for the custom mask, lifts dynamo's recompile
        limit to the bounded number of graphs a run compiles (past the default it would run eagerly) and
        makes the graphs guard on the modules' hooks (:func:`compiled_call_settings`)."""
        self.calls += 1
        self.cache.kv_len = self.capacity
        with attention_implementation(self.model, self._switch), compiled_call_settings():
            yield

    def whole_cache_step(self, ids, positions, columns, vis: Visibility, offsets=None, keep=None) -> torch.Tensor:
        """The model call over the whole cache (fixed shapes), for a compiled decode step to trace."""
        return self._forward(ids, positions, offsets, vis, columns, keep)

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, columns: torch.Tensor, vis: Visibility,
                 kv_len: int, offsets: torch.Tensor | None = None, keep: int | torch.Tensor | None = None,
                 plain: bool = False) -> torch.Tensor:
        """Logits ``[batch, K, V]`` of the queries ``keep`` selects (an int: the last K; a tensor of
        query indices; None: all).

        Args:
            ids, positions: ``[batch, Q]`` tokens and their position ids.
            columns: ``[Q]`` cache columns the queries' KV is written to (the same for every row).
            vis: what each query sees; ``kv_len``: the cache columns the call attends over (the
                visible ones must lie below it).
            offsets: ``[batch, Q]`` offset rows (None: all 0, plain NTP).
            plain: every query sees every column below ``kv_len`` (a 1-query NTP step of unpadded
                rows): the model runs without a mask, as in a plain decode.
        """
        if offsets is not None and not self.takes_offsets:
            raise ValueError(f"offset rows need an RPTForCausalLM, got {type(self.model).__name__}")
        self.calls += 1
        if self.check_each_call:
            self.refresh()
        q = ids.shape[1]
        if self._compiled is not None and self._compiles(q, columns):
            with attention_implementation(self.model, self._switch):
                return self._compiled_call(ids, positions, columns, vis, offsets, keep)
        self.cache.kv_len = kv_len
        if plain:  # no custom mask: the model's own kernel (flash / flex included) runs the call
            return self._forward(ids, positions, offsets, vis, columns, keep, plain=True)
        with attention_implementation(self.model, self._switch):
            return self._forward(ids, positions, offsets, vis, columns, keep)

    def _compiles(self, q: int, columns: torch.Tensor) -> bool:
        """Whether a call of ``q`` queries at ``columns`` runs compiled: a step's block (the last
        :data:`STEP_QUERIES` - 1 columns are kept free for its padding), or a larger one (a prefill) whose
        padding queries, in the cache's last columns, lie past its own columns (one host read per call)."""
        if q == 0 or (self.compile_max_queries is not None and q > self.compile_max_queries):
            return False
        if q <= STEP_QUERIES:
            return True
        size = bucket(q)
        return size <= self.capacity and int(columns.max()) < self.capacity - (size - q)

    def _compiled_call(self, ids, positions, columns, vis, offsets, keep):
        """Pad the block to its bucket with inert queries (scratch columns past the real ones, seeing only
        themselves) and run the compiled call over the whole cache."""
        q, size = ids.shape[1], bucket(ids.shape[1])
        batch = ids.shape[0]
        # one graph whether a block was padded or not: zero pads see what no pads see, and a [Q] limit is
        # every row's (a padded block's is [batch, Q])
        start = torch.zeros(batch, dtype=torch.long, device=ids.device) if vis.start is None else vis.start
        limit = vis.limit if vis.limit.dim() == 2 else vis.limit[None].expand(batch, -1).contiguous()
        vis = Visibility(limit, start, vis.since)
        if size > q:
            extra = size - q
            spare = torch.arange(extra, device=columns.device) + self.capacity - extra
            columns = torch.cat([columns, spare])
            ids = torch.cat([ids, ids.new_zeros(batch, extra)], 1)
            positions = torch.cat([positions, positions.new_zeros(batch, extra)], 1)
            if offsets is not None:
                offsets = torch.cat([offsets, offsets.new_zeros(batch, extra)], 1)
            since = None if vis.since is None else torch.cat([vis.since, spare])
            vis = Visibility(torch.cat([limit, limit.new_full((batch, extra), -1)], 1), start, since)
        if offsets is None and self.takes_offsets:
            offsets = torch.zeros_like(ids)  # one graph for NTP and RPT steps
        # an expanded (stride 0) input would compile a second graph for the same shapes
        ids, positions = ids.contiguous(), positions.contiguous()
        offsets = None if offsets is None else offsets.contiguous()
        # a prefill keeps its few logits inside the graph (its head over every query would be most of its
        # work); a step's block keeps all, sliced below, so that its calls share one graph per bucket
        inner_keep = None
        if q > STEP_QUERIES and keep is not None:
            inner_keep = torch.arange(q - keep, q, device=ids.device) if isinstance(keep, int) else keep
        self.cache.kv_len = self.capacity
        # the graphs of a run are bounded (capacity buckets x query buckets) but may pass dynamo's
        # default limit of 8 per frame over many widths, where it would silently run eagerly
        # the KV is allocated outside any graph, marked static (as graph replay needs), so that no graph is
        # traced around an allocation later calls would not repeat: by the fused call, which knows its
        # shapes, before the first call; with the model's own forward, by the cache's first call, run eagerly
        fused = self._fused
        if fused is not None and not self.cache.layers[0].is_initialized:
            fused.allocate(self.cache, batch, ids.device)
        step = self._compiled if self.cache.layers[0].is_initialized else self._compiled_step
        with compiled_call_settings():
            logits = step(ids, positions, offsets, vis.limit, vis.start, vis.since, columns, inner_keep)
        if inner_keep is not None:
            return logits
        if keep is None:
            return logits[:, :q]
        return logits[:, q - keep:q] if isinstance(keep, int) else logits[:, keep]
