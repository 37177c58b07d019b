r"""``generate``: the fast RPT sampler, one model call per new token on the common path.

Same algorithm and results as :func:`rpt.sampling.reference.generate_reference` (read that first),
computed on a KV cache.

**Layout.** All rows advance in lockstep over the columns of one left-padded layout (the prompts end at
column ``W - 1``; column ``n`` is the newest token of every row). The cache holds *slots*, each the
KV of one token fed with offset row 0 (NTP) at its own position; ``slot_col[b, s]`` is the column
of slot s in row b, or ``HOLE`` (left padding, a rolled-back token, an idle row's filler).

**One call** feeds, per row, a block of query tokens:

* the *NTP region*: columns ``valid_upto .. n`` (usually just ``x_n``; a refill after a rollback),
  offset row 0, each attending to the NTP slots of columns ``<=`` its own;
* one *PTP chain* per revisited ``x_j`` (``lag = n - j`` in ``1..w-1``): ``x_{j+1}, ..., x_n`` at
  their own positions with offset rows ``1..lag``, attending to the NTP slots of columns ``< j``
  (never ``x_j``, which they may replace) and to the earlier tokens of their own chain. The logits
  at the chain's last token are ``p(x_j | x_{<j}, x_{j+1..n})`` (eq. 8).

Both kinds ride in one call through a 4D additive attention mask built from ``slot_col`` and each
query's column limit and chain id; then the chains' KV is cropped off the end of the cache (the
region's stays: it is the NTP KV of those columns). The logits at ``x_{n-1}`` and ``x_n`` give the
NTP proposals for ``x_n`` (needed after a correction) and ``x_{n+1}``; all proposals (and PTP
acceptances) reach the host with **one** transfer per call.

**Common path.** A step feeds ``[x_n | chains]`` (w=2: two tokens), the sweep accepts nothing and
``x_{n+1}`` is the NTP proposal already computed: one call per token. **After an accepted
correction** at ``x_j`` the row's slots of columns ``>= j`` become holes (trailing holes of all rows
are cropped), everything computed from the old token is dropped, and the next call refills
``x_j..x_n`` together with whatever the sweep needs next (the remaining chains; for the
re-proposal of ``x_n`` the logits at ``x_{n-1}``; speculatively the next iteration's chains).
Rows whose position is settled wait (idle filler) while other rows finish theirs.
"""

from __future__ import annotations

import time

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rpt.model import RPTForCausalLM
from rpt.sampling.common import (
    FrozenStream,
    GenerateOutput,
    HealingFrontier,
    Proposer,
    assemble,
    check_model,
    check_streamer,
    effective_max_new_tokens,
    make_generator,
    pad_token_id,
    prepare_prompts,
)
from rpt.sampling.config import SamplingConfig
from rpt.sampling.healing import TokenHealingLogitsProcessor
from rpt.sampling.stopping import StopChecker

SWEEP, REPROPOSE, NTP = "sweep", "repropose", "ntp"
HOLE = 1 << 40  # slot column of a hole: above every query's column limit, so one compare masks it


class _Row:
    """Host-side state of one row: its tokens (the truth) and what is known about them."""

    def __init__(self, index: int, tokens: list[int], pad: int, frontier: HealingFrontier, stream: FrozenStream):
        self.index, self.tokens, self.pad = index, tokens, pad
        self.frontier, self.stream = frontier, stream
        self.valid_upto = pad  # columns < valid_upto have their NTP KV in the cache
        self.phase, self.it, self.j, self.changed = NTP, 0, 0, False
        self.ptp: dict[int, list[tuple[int, bool]]] = {}  # column -> (proposal, accepted) per iteration
        self.ntp_prev: int | None = None  # proposal for x_n from the logits at n-1 (current tokens)
        self.ntp_next: int | None = None  # proposal for x_{n+1} from the logits at n
        self.finished, self.reason = False, "length"
        self.slots: list[int] = []  # host copy of slot_col[b]
        self.last_valid = -1


class _Decoder:
    """One ``generate`` call: host state per row, the KV cache and its slot map, the proposal rules."""

    def __init__(self, model, config: SamplingConfig, input_ids: torch.Tensor, attention_mask, tokenizer, streamer):
        self.start = time.perf_counter()
        config.validate()
        check_model(model, config)
        self.model, self.config, self.input_ids = model, config, input_ids
        self.is_rpt = isinstance(model, RPTForCausalLM)
        self.stopper = StopChecker(config.eos_token_ids, config.stop, tokenizer, window=config.rpt_window)
        self.prompts = prompts = prepare_prompts(input_ids, attention_mask, config, tokenizer)
        check_streamer(streamer, len(prompts.rows))
        self.max_new = effective_max_new_tokens(model, prompts, config)
        self.device = device = input_ids.device
        self.pad_id = pad_token_id(model, config)
        self.k = config.rpt_iters if self.is_rpt else 0
        self.w = config.rpt_window
        self.W = W = prompts.width
        self.last = W + self.max_new - 1  # last column to generate
        batch = len(prompts.rows)

        pads = prompts.pads
        self.seqs = torch.full((batch, W + self.max_new), self.pad_id, dtype=torch.long, device=device)
        for b, p in enumerate(prompts.rows):
            self.seqs[b, W - len(p): W] = torch.tensor(p, dtype=torch.long)
        healing = None
        if any(prompts.prefixes):
            healing = TokenHealingLogitsProcessor(prompts.vocab, prompts.prefixes, W)
        pad_length = torch.tensor(pads, device=device) if max(pads) > 0 else None
        self.proposer = Proposer(config, W, pad_length, healing, make_generator(config, device))
        self.samples = 1 if self.proposer.ptp_samples_greedy else max(self.k, 1)
        self.rows = [
            _Row(b, [self.pad_id] * pads[b] + list(p), pads[b], HealingFrontier(prompts.vocab, prefix),
                 FrozenStream(streamer, p, config))
            for b, (p, prefix) in enumerate(zip(prompts.rows, prompts.prefixes))
        ]
        self.cache = DynamicCache(config=model.config)
        if any(type(layer) is not DynamicLayer for layer in self.cache.layers):
            raise ValueError("the fast RPT decoder needs full-attention layers with a plain DynamicCache; "
                             "use generate_reference for sliding-window or recurrent models")
        self.slot_col = torch.empty(batch, 0, dtype=torch.long, device=device)
        self._keep: dict[tuple[int, ...], torch.Tensor] = {}
        self._zero = torch.zeros((), dtype=model.dtype, device=device)
        self._neg = torch.full((), torch.finfo(model.dtype).min, dtype=model.dtype, device=device)
        self.n_holes = 0
        self.writes: list[tuple[int, int, int]] = []
        self.rollback = False
        self.calls = self.corrections = 0

    # ---- the per-row state machine (host) ----------------------------------------------------
    def _lo(self, r: _Row, n: int) -> int:
        """First column the window of position n may revisit (generated, not frozen by healing)."""
        return max(n - self.w + 1, self.W + r.frontier.first_revisable(n - self.W))

    def _set(self, r: _Row, col: int, tok: int, n: int) -> None:
        """Replace a token and forget everything computed from the old one."""
        r.tokens[col] = tok
        r.ptp.clear()  # every chain either conditions on x_col or feeds it
        if col <= n - 1:
            r.ntp_prev = None
        r.ntp_next = None
        if r.valid_upto > col:
            r.valid_upto = col
            self.rollback = True
        self.writes.append((r.index, col, tok))

    def _settle(self, r: _Row, n: int) -> bool:
        """Run the algorithm for position n as far as known logits allow; True once n is settled."""
        while True:
            if r.phase == SWEEP:
                if r.j >= n:  # the sweep over the window is complete
                    r.it += 1
                    if r.changed:
                        r.phase = REPROPOSE
                    elif r.it >= self.k or self.proposer.ptp_samples_greedy:
                        r.phase = NTP  # greedy PTP on unchanged tokens would repeat this sweep exactly
                    else:
                        r.j, r.changed = self._lo(r, n), False
                    continue
                res = r.ptp.get(r.j)
                if res is None:
                    return False
                tok, accepted = res[min(r.it, len(res) - 1)]
                if accepted and tok != r.tokens[r.j]:
                    self._set(r, r.j, tok, n)
                    r.changed = True
                    self.corrections += 1
                r.j += 1
            elif r.phase == REPROPOSE:
                if r.ntp_prev is None:
                    return False
                if r.ntp_prev != r.tokens[n]:
                    self._set(r, n, r.ntp_prev, n)
                if r.it >= self.k:
                    r.phase = NTP
                else:
                    r.phase, r.j, r.changed = SWEEP, self._lo(r, n), False
            else:
                return r.ntp_next is not None or n == self.last

    def _needed_chains(self, r: _Row, n: int) -> list[int]:
        """Offsets lag (chain for x_{n-lag}) this row needs computed in the next call."""
        if r.phase == SWEEP:
            # after a change the next iteration needs every chain again (if x_n stays): ask now
            start = self._lo(r, n) if r.changed and r.it + 1 < self.k else r.j
            return [n - j for j in range(start, n) if j not in r.ptp]
        if r.phase == REPROPOSE and r.it < self.k:  # speculative: the next sweep, if x_n stays
            return [n - j for j in range(self._lo(r, n), n)]
        return []

    # ---- cache bookkeeping -------------------------------------------------------------------
    def _apply_rollback(self) -> None:
        """Turn the slots of rolled-back columns into holes; crop holes that trail in every row."""
        thr = torch.tensor([r.valid_upto for r in self.rows], device=self.device)
        self.slot_col = self.slot_col.masked_fill(self.slot_col >= thr[:, None], HOLE)
        for r in self.rows:
            i = r.last_valid
            while i >= 0 and r.slots[i] >= r.valid_upto:
                if r.slots[i] != HOLE:
                    r.slots[i] = HOLE
                    self.n_holes += 1
                i -= 1
            r.last_valid = i
        keep = max(r.last_valid for r in self.rows) + 1
        drop = self.slot_col.shape[1] - keep
        if drop > 0:
            self.cache.crop(-drop)
            self.slot_col = self.slot_col[:, :keep]
            for r in self.rows:
                self.n_holes -= len(r.slots) - keep
                del r.slots[keep:]

    def _apply_writes(self) -> None:
        if len(self.writes) <= 2:  # the common path (one new token): scalar writes are cheapest
            for b, c, tok in self.writes:
                self.seqs[b, c] = tok
        else:
            w = torch.tensor(self.writes, dtype=torch.long, device=self.device)
            self.seqs[w[:, 0], w[:, 1]] = w[:, 2]
        self.writes.clear()

    # ---- one model call ----------------------------------------------------------------------
    def _call(self, blocked: list[_Row], n: int) -> None:
        if self.rollback:
            self._apply_rollback()
            self.rollback = False
        self._apply_writes()
        batch = len(self.rows)
        chains = {r.index: self._needed_chains(r, n) for r in blocked}
        R = max(n + 1 - r.valid_upto for r in blocked)
        ls = sorted({lag for c in chains.values() for lag in c})
        offset, M = {}, R
        for lag in ls:
            offset[lag], M = M, M + lag
        # host layout [B, M, 5 + M]: token, position, offset row, slot column, column limit, then the
        # query's row of the in-block mask (the diagonal, and earlier tokens of its own chain)
        F = 5
        host = [[[0, 0, 0, HOLE, -1] + [0] * M for _ in range(M)] for _ in range(batch)]
        for q in range(M):
            for b in range(batch):
                host[b][q][F + q] = 1
        full = len(blocked) == batch  # every row feeds a full NTP region and nothing else
        for r in blocked:
            b, h = r.index, host[r.index]
            full = full and n + 1 - r.valid_upto == R
            for c in range(r.valid_upto, n + 1):  # right-aligned: column n sits at R - 1
                h[R - 1 - (n - c)][:F] = [r.tokens[c], c - r.pad, 0, c, c]
            for lag in chains[b]:
                j = n - lag
                for m in range(lag):
                    q = offset[lag] + m
                    h[q][:F] = [r.tokens[j + 1 + m], j + 1 + m - r.pad, m + 1, HOLE, j - 1]
                    for e in range(m):
                        h[q][F + offset[lag] + e] = 1
        dev = torch.tensor(host, dtype=torch.long).to(self.device, non_blocking=True)
        ids_d, pos_d, orow_d, kcol_d, qlim_d = dev[..., :F].unbind(-1)

        S = self.slot_col.shape[1]
        keys = torch.cat([self.slot_col, kcol_d], dim=1)  # slot columns of the cache after the call
        if full and not ls and self.n_holes == 0:
            mask = None  # a plain causal block over a hole-free cache: let the model build its own
        else:
            allowed = keys[:, None, :] <= qlim_d[:, :, None]  # NTP slots up to each query's limit
            allowed[:, :, S:] |= dev[..., F:].bool()  # plus the diagonal and the query's own chain
            mask = torch.where(allowed, self._zero, self._neg)[:, None]
        # logits to compute: x_n's (NTP for x_{n+1}), x_{n-1}'s (re-proposal of x_n), each chain's last
        need_prev = n - 1 >= self.W and any(r.phase != NTP and r.valid_upto <= n - 1 for r in blocked)
        keep = ([R - 1] if R > 0 else []) + ([R - 2] if need_prev else []) + [offset[lag] + lag - 1 for lag in ls]
        if keep == list(range(M - len(keep), M)):
            keep_t = len(keep)  # a suffix: plain slicing
        else:
            keep_t = self._keep.get(tuple(keep))
            if keep_t is None:
                keep_t = self._keep[tuple(keep)] = torch.tensor(keep, device=self.device)
        kwargs = dict(position_ids=pos_d, attention_mask=mask, past_key_values=self.cache, use_cache=True,
                      logits_to_keep=keep_t)
        if self.is_rpt and ls:  # without chains every offset is row 0, the model's default
            kwargs["offset_ids"] = orow_d
        logits = self.model(ids_d, **kwargs).logits
        self.calls += 1

        if ls:  # the chains' KV is not NTP KV of any column: drop it
            self.cache.crop(-(M - R))
        self.slot_col = keys[:, : S + R]
        for r in self.rows:
            base = len(r.slots)
            new = [host[r.index][q][3] for q in range(R)]
            r.slots.extend(new)
            self.n_holes += new.count(HOLE)
            for i in range(R - 1, -1, -1):
                if new[i] != HOLE:
                    r.last_valid = base + i
                    break

        # proposals on device, then one transfer to the host
        out, at = [], 0
        if R > 0:
            out.append(self.proposer.ntp(self.seqs[:, : n + 1], logits[:, at])[:, None])
            at += 1
        if need_prev:
            out.append(self.proposer.ntp(self.seqs[:, :n], logits[:, at])[:, None])
            at += 1
        for i, lag in enumerate(ls):
            tok, acc = self.proposer.ptp(self.seqs[:, : n - lag], logits[:, at + i], self.samples)
            out += [tok, acc.long()]
        vals = torch.cat(out, dim=1).tolist()

        s = self.samples
        for r in blocked:
            v = vals[r.index]
            if r.valid_upto <= n:  # x_n was fed in this call
                r.ntp_next = v[0]
            if need_prev and r.phase != NTP and r.valid_upto <= n - 1:  # so was x_{n-1}
                r.ntp_prev = v[1]
            r.valid_upto = n + 1
            for i, lag in enumerate(ls):
                if lag in chains[r.index]:
                    c = at + 2 * s * i
                    r.ptp[n - lag] = list(zip(v[c: c + s], map(bool, v[c + s: c + 2 * s])))

    # ---- the decode loop ---------------------------------------------------------------------
    def run(self) -> GenerateOutput:
        W, n = self.W, self.W - 1
        live = list(self.rows)
        while True:
            blocked = [r for r in live if not self._settle(r, n)]
            if blocked:
                self._call(blocked, n)
                continue
            if n >= W:  # position n is settled in every live row
                for r in live:
                    gen = r.tokens[W:]
                    r.frontier.update(gen)
                    reason, keep = self.stopper.check(gen, since=n - self.w + 1 - W)
                    if reason is not None:
                        del r.tokens[W + keep:]
                        r.finished, r.reason = True, reason
                    else:
                        r.stream.update(gen)
                live = [r for r in live if not r.finished]
            if n == self.last or not live:
                break
            n += 1
            for r in live:
                r.tokens.append(r.ntp_next)
                self.writes.append((r.index, n, r.ntp_next))
                r.ntp_prev = r.ntp_next = None
                r.ptp.clear()
                r.it, r.changed = 0, False
                r.j = self._lo(r, n)
                r.phase = SWEEP if self.k > 0 and r.j < n else NTP
        generated = [r.tokens[W:] for r in self.rows]
        for r in self.rows:
            r.stream.end(r.tokens[W:])
        stats = {"forward_passes": self.calls, "corrections": self.corrections}
        return assemble(self.input_ids, self.prompts, generated, [r.reason for r in self.rows], self.pad_id, stats,
                        self.start, healed=self.config.token_healing)


@torch.no_grad()
def generate(model, input_ids: torch.Tensor, config: SamplingConfig, attention_mask: torch.Tensor | None = None,
             *, tokenizer=None, streamer=None) -> GenerateOutput:
    """Sample continuations of ``input_ids`` (``[batch, T]``, left-padded with ``attention_mask``) with RPT.

    Args:
        model: an :class:`~rpt.model.RPTForCausalLM` (any HF causal LM when ``rpt_iters == 0``), in
            eval mode.
        input_ids, attention_mask: the prompts; rows of different lengths are left-padded.
        config: every knob (``rpt_iters = 0`` is plain NTP sampling).
        tokenizer: needed for stop strings and token healing.
        streamer: for a single prompt, an object with ``put(ids)`` / ``end()`` (Hugging Face
            streamer protocol; the first ``put`` is the prompt) that receives each generated token
            once RPT can no longer change it.

    Returns:
        :class:`~rpt.sampling.common.GenerateOutput` (``.sequences``, ``.stats``, ...).
    """
    checks = getattr(model, "check_offsets", None)
    if checks is not None:
        model.check_offsets = False  # the offsets are built here; its range check would sync every call
    try:
        with torch.inference_mode():  # fewer per-op checks than no_grad; nothing here needs autograd
            out = _Decoder(model, config, input_ids, attention_mask, tokenizer, streamer).run()
        out.sequences = out.sequences.clone()  # a normal tensor, so callers may edit it in place
        return out
    finally:
        if checks is not None:
            model.check_offsets = checks
