r"""The buffers a compiled decode borrows, pooled per model and bucket, so that every decode of a bucket
runs its compiled (on CUDA: graph-replayed) steps on the same storage.

A bucket is ``(batch bucket, capacity bucket, window shape, ...)`` (:func:`buffers_key`): the KV cache's
capacity and the batch are rounded up (:func:`rpt.decode_forward.queries.capacity_bucket`, :func:`rpt.decode_forward.queries.batch_bucket`:
the rows past a decode's are inert), so decodes of many prompt widths and batch sizes share one entry,
one set of compiled graphs and no re-capture.

**Who owns what, and when it is freed.** The pool owns its entries. An entry -- the
:class:`~rpt.decode_forward.queries.ModelQueries` with its KV cache, the :class:`~rpt.sampling.decode.state.DecodeState`
and the compiled steps reading them -- is *lent* to one decode at a time (:func:`borrow` ... the
decoder's ``close``); a decode that finds its entry lent out (a nested or concurrent ``generate`` on
the same model) gets a fresh, unpooled one that it owns and that is freed with it. The pool is read
and changed under one lock, so two threads never borrow one entry (one KV cache) at once. The pool keeps the
:data:`POOLED_PER_MODEL` most recently used entries of each model (a KV cache is the decode's largest
allocation: on a 1B model at batch 16 and 2048 columns about 1 GB) and drops the least recent one
beyond that; all of a model's entries go when the model is garbage collected (the pool hangs on
the model itself, so an entry's reference back to it is a cycle the collector frees with it, where
a weak-keyed table would keep every model alive through its entries) or on
:func:`release_decode_buffers`. Eager decodes (``compile=False``) borrow nothing: their
state is the decoder's own and is freed with it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from rpt.decode_forward.queries import ModelQueries
from rpt.sampling.decode.state import DecodeState, eos_slots

POOLED_PER_MODEL = 2
_ATTRIBUTE = "_rpt_decode_buffers"  # the model's pool: OrderedDict[key, DecodeBuffers], least recent first
# every pool's reads and changes: a check of `lent` and its setting are one step (two threads calling generate
# on one model must not both take the entry, and so one KV cache); held for microseconds, and while an
# entry's buffers are first allocated
_LOCK = threading.RLock()


@dataclass
class RememberedFailure:
    """A compile failure of a bucket's steps (``reason``: :func:`rpt.decode_forward.compile_guard.describe`'s line)
    and its ``cause``: what the failed graphs were traced from (the traced sampling config, the model's
    fused-call epoch: :attr:`~rpt.decode_forward.queries.ModelQueries.epoch`)."""

    reason: str
    cause: tuple
    skips: int  # later decodes of the same cause that run eagerly at once (warned) before one compiles again
    backoff: int  # the skips of this cause's last failure: the next failure of it doubles them


@dataclass(eq=False)
class DecodeBuffers:
    """One bucket's model queries (KV cache), decode state and compiled steps (built at first use)."""

    queries: ModelQueries
    state: DecodeState
    steps: dict = field(default_factory=dict)  # name -> compiled step (ntp_path.CompiledNTPStep / rpt_path.CompiledRPTStep)
    lent: bool = False
    failure: RememberedFailure | None = None

    def skip(self, cause: tuple) -> str | None:
        """Why a decode of ``cause`` runs eagerly at once (None: it compiles). A remembered failure of the same
        cause is not compiled (and failed) again by the next decodes -- 1 after its first failure, then 2, 4,
        ... after each retry that fails again -- and a decode of another cause (another sampling config, a
        model whose fused call changed: a hook removed, a module replaced) compiles at once: a fallback does
        not outlive its cause, and a lasting one costs a compile attempt per doubling of the decodes."""
        failure = self.failure
        if failure is None or failure.cause != cause or failure.skips <= 0:
            return None
        failure.skips -= 1
        return failure.reason

    def remember(self, reason: str, cause: tuple) -> None:
        """A compiled decode of ``cause`` failed: the next decodes of it skip compiling (:meth:`skip`)."""
        last = self.failure
        backoff = last.backoff * 2 if last is not None and last.cause == cause else 1
        self.failure = RememberedFailure(reason, cause, backoff, backoff)

    def compiled(self, cause: tuple) -> None:
        """A compiled decode of ``cause`` ran: its failure, if one was remembered, is gone."""
        if self.failure is not None and self.failure.cause == cause:
            self.failure = None


def buffers_key(batch: int, capacity: int, window: int, ntp_draws: int, eos_count: int, backend) -> tuple:
    """The bucket of a decode: what fixes the buffers' shapes and the compiled steps' graphs."""
    return batch, capacity, window, ntp_draws, eos_slots(eos_count), backend


def borrow(model, key: tuple, build: Callable[[], DecodeBuffers]) -> tuple[DecodeBuffers, bool]:
    """The pooled entry of ``key`` for ``model`` (``build`` makes it the first time), marked lent, and
    whether it is pooled (False: the entry was lent out already, this fresh one is the caller's)."""
    with _LOCK:
        entries = model.__dict__.setdefault(_ATTRIBUTE, OrderedDict())  # not a submodule, parameter or buffer
        entry = entries.get(key)
        lent_out = entry is not None and entry.lent
        if entry is None:
            entry = entries[key] = build()
            _evict(entries, key)
        if not lent_out:
            entries.move_to_end(key)
            entry.lent = True
            entry.queries.calls = 0  # the forward-pass count is per decode
            return entry, True
    return build(), False  # outside the lock: the caller's own buffers


def _evict(entries: OrderedDict, keep: tuple) -> None:
    """Drop the least recently used entries that are not lent beyond :data:`POOLED_PER_MODEL`."""
    for key in [k for k, e in entries.items() if not e.lent and k != keep]:
        if len(entries) <= POOLED_PER_MODEL:
            return
        del entries[key]  # nothing else holds it (it is not lent): its tensors are freed now


def give_back(entry: DecodeBuffers) -> None:
    """The decode is over: the entry may be lent again."""
    with _LOCK:
        entry.lent = False


def release_decode_buffers(model) -> None:
    """Drop every pooled entry of ``model`` (its KV caches, states and compiled steps) now."""
    with _LOCK:
        model.__dict__.pop(_ATTRIBUTE, None)


def pooled(model) -> list[tuple]:
    """The keys of ``model``'s pooled entries, least recently used first."""
    with _LOCK:
        return list(model.__dict__.get(_ATTRIBUTE, {}))


def pooled_entries(model) -> list[DecodeBuffers]:
    """``model``'s pooled entries, least recently used first."""
    with _LOCK:
        return list(model.__dict__.get(_ATTRIBUTE, {}).values())
