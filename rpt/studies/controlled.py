r"""The controlled experiment: RPT vs NTP sampling of a trained model, measured against a known truth.

The data source is a hidden Markov model (:mod:`rpt.studies.hmm`) over a small vocabulary, so the
true joint of the next ``w`` tokens after any context follows from the forward algorithm. A model
is trained on samples of it with ``train.py`` (NTP pretraining, then the RPT fine-tune); then, for
contexts drawn from the source, the *exact* law of the ``w`` tokens the model would sample --
NTP (``k = 0``) and after ``k`` RPT iterations (eq. 4 / 6, sampled PTP at temperature 1) -- is
computed by enumeration (:mod:`rpt.studies.window_chain`) from the model's own conditionals
and compared with the true joint in total variation. The design and its rationale are in
``docs/controlled_experiment.md``.

This module holds the pieces: the fixed source design, writing its samples and a one-symbol-per-
token tokenizer for ``train.py``, querying a model for every conditional the chain needs (plain
forward calls with ``position_ids`` and ``offset_ids``, no sampler code), the Sec. 3 error
measures (``eps_p`` / ``eps_n``), the Sec. 3 noise-model prediction for this source, bootstrap
intervals, the summary and the plot.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from matplotlib.figure import Figure

from rpt.studies import hmm as hmm_lib
from rpt.studies import window_chain as wc
from rpt.studies.synthetic import stationary

EOS_TOKEN = "<|endoftext|>"
UNK_TOKEN = "<unk>"


# ---- the fixed design (docs/controlled_experiment.md; chosen before any model was trained) ---------
@dataclass(frozen=True)
class Design:
    hidden: int = 8  # hidden states H
    vocab: int = 16  # symbols V
    trans_concentration: float = 0.3  # Dirichlet rows of the transition matrix
    emit_concentration: float = 0.3  # Dirichlet rows of the emission matrix
    stay: float = 0.0
    hmm_seed: int = 0
    doc_len: int = 64  # tokens per training document (= seq_len: one document per training row)
    train_docs: int = 20000
    val_docs: int = 500
    window: int = 2  # w of the evaluated chain (eq. 4) and of the RPT fine-tune
    iters: int = 2  # k = 0..iters
    contexts: int = 1000  # evaluation contexts drawn from the source
    context_len: int = 32
    eval_seed: int = 12345  # seed of the evaluation contexts (training data use other seeds)
    theory_eps_n: float = 0.1  # Sec. 3 noise model: base noise (first-order regime)
    theory_ratios: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}

    def source_dict(self) -> dict:
        """The fields the written samples depend on (a change means new data and new models)."""
        keys = ("hidden", "vocab", "trans_concentration", "emit_concentration", "stay", "hmm_seed", "doc_len",
                "train_docs", "val_docs")
        return {k: getattr(self, k) for k in keys}

    @classmethod
    def from_dict(cls, d: dict) -> Design:
        return cls(**{**d, "theory_ratios": tuple(d["theory_ratios"])})

    def make_hmm(self) -> hmm_lib.HMM:
        return hmm_lib.random_hmm(self.hidden, self.vocab, self.hmm_seed, stay=self.stay,
                                  trans_concentration=self.trans_concentration,
                                  emit_concentration=self.emit_concentration)


# ---- data for train.py -------------------------------------------------------------------------------
def symbol(i: int) -> str:
    return f"s{i}"


def symbol_tokenizer(vocab: int):
    """A word-level tokenizer: symbol ``i`` (written ``s<i>``) is token id ``i``, then EOS, UNK."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {symbol(i): i for i in range(vocab)}
    words[EOS_TOKEN], words[UNK_TOKEN] = vocab, vocab + 1
    tok = Tokenizer(models.WordLevel(words, unk_token=UNK_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN,
                                   pad_token=EOS_TOKEN, unk_token=UNK_TOKEN)


def write_documents(path: str, rows: np.ndarray) -> None:
    """Token-id documents ``[n, T]`` as JSONL for ``train.py``: one line of symbols per document, atomically."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps({"text": " ".join(symbol(int(t)) for t in row)}) + "\n")
    os.replace(tmp, path)


def write_tokenizer(path: str, vocab: int) -> None:
    """:func:`symbol_tokenizer` saved to ``path`` (written beside it, then renamed into place)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    symbol_tokenizer(vocab).save_pretrained(tmp)
    shutil.rmtree(path, ignore_errors=True)
    os.rename(tmp, path)


@dataclass
class SourceFiles:
    dir: str
    hmm: str = field(init=False)
    train: str = field(init=False)
    validation: str = field(init=False)
    tokenizer: str = field(init=False)

    def __post_init__(self):
        self.hmm = os.path.join(self.dir, "hmm.json")
        self.train = os.path.join(self.dir, "train.jsonl")
        self.validation = os.path.join(self.dir, "validation.jsonl")
        self.tokenizer = os.path.join(self.dir, "tokenizer")


def write_source(out_dir: str, design: Design) -> SourceFiles:
    """Samples of the source as JSONL (one document of ``doc_len`` symbols per line), the HMM and
    the tokenizer. Each document tokenises to ``doc_len`` tokens plus EOS = ``seq_len + 1``, so with
    ``seq_len = doc_len`` every packed training row is exactly one document from its first token."""
    files = SourceFiles(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    hmm = design.make_hmm()
    write_documents(files.train, hmm_lib.sample(hmm, design.train_docs, design.doc_len, seed=design.hmm_seed + 1))
    write_documents(files.validation, hmm_lib.sample(hmm, design.val_docs, design.doc_len, seed=design.hmm_seed + 2))
    write_tokenizer(files.tokenizer, design.vocab)
    with open(files.hmm, "w") as f:
        json.dump({"design": design.to_dict(), "hmm": hmm.to_dict()}, f, indent=1)
    return files


# ---- the model's conditionals ------------------------------------------------------------------------
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


# ---- Sec. 3's error measures (w = 2) -----------------------------------------------------------------
def _tv_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return 0.5 * np.abs(a - b).sum(axis=-1)


def _kl_rows(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    safe_p = np.where(p > 0, p, 1.0)
    return np.where(p > 0, p * (np.log(safe_p) - np.log(np.maximum(q, 1e-300))), 0.0).sum(axis=-1)


def _entropy_rows(p: np.ndarray) -> np.ndarray:
    return -np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0).sum(axis=-1)


def sec3_errors(model: wc.WindowConditionals, truth: wc.WindowConditionals) -> dict[str, np.ndarray]:
    """Per-context errors of the three conditionals of eq. 4 (w = 2), in total variation (half L1).

    * ``eps_marginal``: ``TV(p^(x_i), p(x_i))`` -- the paper's ``||eps_i||_1`` (halved);
    * ``eps_next_max`` / ``eps_prev_max``: the max over conditioning tokens of the NTP
      ``p(x_{i+1}|x_i)`` / PTP ``p(x_i|x_{i+1})`` row errors -- the paper's ``||eps_{i+1|i}||_inf``
      and ``||eps_{i|i+1}||_inf`` (eq. 19, halved);
    * ``eps_next_avg`` / ``eps_prev_avg``: the same rows weighted by the true law of the
      conditioning token (the max is set by rare tokens the model has barely seen);
    * ``kl_*`` / ``entropy_*``: ``KL(truth || model)`` and the true entropy (the paper's eq. 21
      argument: cross-entropy = entropy + KL);
    * ``kappa = 1 / (1 - Lambda)``: Lambda the ergodicity coefficient of the true eq. 27 kernel,
      ``max_{b, b'} TV(p(.|b), p(.|b'))``; ``rho``: the RPT factor of eq. 18.
    """
    if model.window != 2:
        raise ValueError("the Sec. 3 error measures are defined for w = 2")
    pa, n_true, p_true = truth.init[0], truth.init[1], np.swapaxes(truth.resample[0], 1, 2)  # P rows by b
    pa_hat, n_hat, p_hat = model.init[0], model.init[1], np.swapaxes(model.resample[0], 1, 2)
    pb = np.einsum("ba,bac->bc", pa, n_true)
    next_tv, prev_tv = _tv_rows(n_hat, n_true), _tv_rows(p_hat, p_true)
    lam = _tv_rows(p_true[:, :, None, :], p_true[:, None, :, :]).max(axis=(1, 2))
    out = {
        "eps_marginal": _tv_rows(pa_hat, pa),
        "eps_next_max": next_tv.max(axis=1),
        "eps_prev_max": prev_tv.max(axis=1),
        "eps_next_avg": (pa * next_tv).sum(axis=1),
        "eps_prev_avg": (pb * prev_tv).sum(axis=1),
        "kl_marginal": _kl_rows(pa, pa_hat),
        "kl_next": (pa * _kl_rows(n_true, n_hat)).sum(axis=1),
        "kl_prev": (pb * _kl_rows(p_true, p_hat)).sum(axis=1),
        "entropy_marginal": _entropy_rows(pa),
        "entropy_next": (pa * _entropy_rows(n_true)).sum(axis=1),
        "entropy_prev": (pb * _entropy_rows(p_true)).sum(axis=1),
        "kappa": 1.0 / np.maximum(1.0 - lam, 1e-12),
    }
    out["rho"] = out["kappa"] * (out["eps_prev_max"] + out["eps_next_max"]) / np.maximum(
        out["eps_marginal"] + out["eps_next_max"], 1e-300)
    return out


def eps_ratios(errors: dict[str, np.ndarray]) -> dict[str, float]:
    """``eps_p / eps_n`` as ratios of means over contexts: like for like (row-averaged conditionals),
    the paper's max-norms, and PTP against the NTP marginal."""
    m = {k: float(np.mean(v)) for k, v in errors.items()}
    return {
        "prev_avg/next_avg": m["eps_prev_avg"] / m["eps_next_avg"],
        "prev_max/next_max": m["eps_prev_max"] / m["eps_next_max"],
        "prev_avg/marginal": m["eps_prev_avg"] / m["eps_marginal"],
        "kl_prev/kl_next": m["kl_prev"] / m["kl_next"],
    }


def theory_curve(truth: wc.WindowConditionals, joint: np.ndarray, eps_n: float, ratios: Sequence[float],
                 iters: int, seed: int, repeats: int = 3) -> list[dict]:
    """Sec. 3's noise model (eq. 33) on this source's true conditionals: for each ``eps_p / eps_n``,
    the mean TV of the window joint after ``k = 0..iters`` iterations, and the same error measures
    as for a trained model (so a model's measured point sits on the same axes)."""
    curve = []
    for r in ratios:
        tvs, errs = [], []
        for rep in range(repeats):
            noisy = wc.noisy_conditionals(truth, eps_n, r * eps_n, seed=seed + 1000 * rep + int(round(100 * r)))
            tvs.append([wc.tv(j, joint) for j in wc.joints_by_iters(noisy, iters)])
            errs.append(sec3_errors(noisy, truth))
        tv = np.mean(np.asarray(tvs), axis=0)  # [k, B]
        ratio = eps_ratios({k: np.concatenate([e[k] for e in errs]) for k in errs[0]})
        curve.append({"eps_p/eps_n (noise weights)": r, "measured_ratio": ratio["prev_avg/next_avg"],
                      "tv_by_iters": {str(k): float(tv[k].mean()) for k in range(len(tv))},
                      "tv1_over_tv0": float(tv[1].mean() / tv[0].mean()),
                      "frac_improved": float((tv[1] < tv[0]).mean())})
    return curve


# ---- one trained model against the truth ---------------------------------------------------------------
@dataclass
class Truth:
    """The evaluation contexts and, for each, the true window joint and its conditionals."""

    contexts: np.ndarray  # [B, L]
    joint: np.ndarray  # [B] + [V] * w
    cond: wc.WindowConditionals


def truth_for(hmm: hmm_lib.HMM, design: Design) -> Truth:
    contexts = hmm_lib.sample(hmm, design.contexts, design.context_len, seed=design.eval_seed)
    joint = hmm_lib.window_joint(hmm, hmm_lib.predictive_states(hmm, contexts), design.window)
    return Truth(contexts, joint, wc.truth_conditionals(joint))


def stationary_joint(cond: wc.WindowConditionals) -> np.ndarray:
    """``k -> infinity`` for w = 2 (Sec. 3's object): the stationary law of the eq. 27 kernel,
    ``r(a) N(b|a)`` with ``r`` stationary for the ``x_i`` chain ``N @ P``."""
    next_cond, prev_cond = cond.init[1], np.swapaxes(cond.resample[0], 1, 2)
    r = stationary(next_cond @ prev_cond)
    return r[:, :, None] * next_cond


def evaluate_model(model, truth: Truth, design: Design, batch_size: int = 64) -> dict:
    """TV to the truth after ``k = 0..iters`` (``tv[k, context]``), the stationary TV (w = 2),
    the TV of the ``x_i`` marginal by ``k`` and the Sec. 3 error measures, per context; and the
    model's conditionals themselves (``conditionals``)."""
    cond = model_conditionals(model, truth.contexts, design.window, design.vocab, batch_size=batch_size)
    joints = wc.joints_by_iters(cond, design.iters)
    out = {"tv": np.stack([wc.tv(j, truth.joint) for j in joints]), "conditionals": cond}
    axes = tuple(range(2, 1 + design.window))
    out["marginal_tv"] = np.stack([wc.tv(j.sum(axis=axes), truth.joint.sum(axis=axes)) for j in joints])
    if design.window == 2:
        out["tv_stationary"] = wc.tv(stationary_joint(cond), truth.joint)
        out["errors"] = sec3_errors(cond, truth.cond)
    return out


# ---- statistics --------------------------------------------------------------------------------------
def bootstrap_ci(values: np.ndarray, resamples: int = 10000, seed: int = 0, level: float = 0.95) -> list[float]:
    """Percentile bootstrap interval of the mean over the last axis; with ``[S, n]`` values (S
    training seeds on the same n contexts) the statistic is the mean over seeds and contexts, the
    contexts resampled jointly (paired across seeds)."""
    values = np.atleast_2d(np.asarray(values, dtype=np.float64))
    n = values.shape[1]
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for lo in range(0, resamples, 1000):
        idx = rng.integers(0, n, size=(min(1000, resamples - lo), n))
        means[lo:lo + len(idx)] = values[:, idx].mean(axis=(0, 2))
    alpha = (1.0 - level) / 2.0
    return [float(np.quantile(means, alpha)), float(np.quantile(means, 1.0 - alpha))]


def summarise_tv(tv: np.ndarray, seed: int = 0) -> dict:
    """``tv[S, K, n]`` (seeds, iterations, contexts) -> means, intervals, the k = 1 - k = 0 difference."""
    tv = np.asarray(tv, dtype=np.float64)
    s, k, n = tv.shape
    out = {
        "k": {str(i): {"mean": float(tv[:, i].mean()), "ci95": bootstrap_ci(tv[:, i], seed=seed)} for i in range(k)},
        "tv_by_iters": {str(i): float(tv[:, i].mean()) for i in range(k)},
    }
    for i in range(1, k):
        diff = tv[:, i] - tv[:, 0]
        out[f"diff_{i}_0"] = {"mean": float(diff.mean()), "ci95": bootstrap_ci(diff, seed=seed + i),
                              "frac_contexts_improved": float((diff < 0).mean())}
    if k > 1:
        out["diff_ci95"] = out["diff_1_0"]["ci95"]
    return out


def source_stats(truth: Truth) -> dict:
    """What Sec. 3 asks of the source, from the truth alone (w = 2): how much the next token tells
    about the current one (entropy with and without it) and how fast the eq. 27 chain mixes."""
    if truth.cond.window != 2:
        return {}
    errs = sec3_errors(truth.cond, truth.cond)  # zero errors; the entropies and kappa are the truth's
    h_ntp, h_ptp = float(errs["entropy_marginal"].mean()), float(errs["entropy_prev"].mean())
    return {"entropy_ntp": h_ntp, "entropy_ptp": h_ptp, "information_next_about_current": h_ntp - h_ptp,
            "kappa_mean": float(errs["kappa"].mean()), "kappa_median": float(np.median(errs["kappa"]))}


def _mean_ci(values: np.ndarray, seed: int) -> dict:
    return {"mean": float(np.mean(values)), "ci95": bootstrap_ci(values, seed=seed)}


def summarise(design: Design, runs: Sequence[dict], theory: dict, stats: dict) -> dict:
    """The JSON of the experiment. ``runs``: per training seed, :func:`evaluate_model`'s arrays
    plus ``seed``, ``checkpoint`` and ``losses``."""
    tv = np.stack([r["tv"] for r in runs])  # [S, K, n]
    out = {
        "experiment": "controlled",
        "metric": (f"total variation distance between the law of the next {design.window} tokens sampled by the "
                   f"trained model (k RPT iterations, eq. 4, sampled PTP and NTP at temperature 1) and the true "
                   f"joint from the source, exact by enumeration, mean over {tv.shape[2]} contexts drawn from "
                   f"the source x {len(runs)} training seeds"),
        "lower_is_better": True,
        "window": design.window, "iters": design.iters, "contexts": int(tv.shape[2]),
        "context_len": design.context_len, "seeds": [r["seed"] for r in runs],
        **summarise_tv(tv),
    }
    out["goal"] = "k = 1 closer to the truth than k = 0 with the 95% interval of (k = 1) - (k = 0) below zero"
    out["goal_reached"] = bool(out["diff_ci95"][1] < 0.0)
    out["marginal_tv_by_iters"] = {str(k): float(np.stack([r["marginal_tv"][k] for r in runs]).mean())
                                   for k in range(tv.shape[1])}
    per_seed = []
    for i, r in enumerate(runs):
        entry = {"seed": r["seed"], "checkpoint": r["checkpoint"], "losses": r.get("losses"),
                 **summarise_tv(r["tv"][None], seed=17 + i)}
        if "errors" in r:
            entry["eps"] = {k: float(np.mean(v)) for k, v in r["errors"].items()}
            entry["eps_ratios"] = eps_ratios(r["errors"])
            entry["stationary"] = _mean_ci(r["tv_stationary"], seed=31 + i)
        per_seed.append(entry)
    out["per_seed"] = per_seed
    if all("errors" in r for r in runs):
        errors = {k: np.concatenate([r["errors"][k] for r in runs]) for k in runs[0]["errors"]}
        out["eps"] = {k: float(np.mean(v)) for k, v in errors.items()}
        out["eps_ratios"] = eps_ratios(errors)
        stat = np.stack([r["tv_stationary"] for r in runs])
        out["stationary"] = {**_mean_ci(stat, seed=41), "diff_vs_k0": _mean_ci(stat - tv[:, 0], seed=43)}
    out["theory"] = theory
    out["source"] = stats
    out["design"] = design.to_dict()
    return out


# ---- plot --------------------------------------------------------------------------------------------
def plot(summary: dict, others: Sequence[tuple[str, dict]] = ()) -> Figure:
    """Left: mean TV to the truth by RPT iteration (95% intervals), pooled and per seed. Right: the
    Sec. 3 noise-model prediction for this source (TV_1 / TV_0 against the measured eps_p / eps_n)
    with the trained models' measured points, and those of ``others`` (label, summary) runs."""
    fig = Figure(figsize=(11, 4))
    ax, bx = fig.subplots(1, 2)
    ks = sorted(summary["k"], key=int)
    x = np.array([int(k) for k in ks], dtype=float)
    for i, run in enumerate(summary["per_seed"]):
        means = [run["k"][k]["mean"] for k in ks]
        ax.plot(x + 0.05 * (i + 1), means, "o:", color="tab:gray", alpha=0.7, label="per seed" if i == 0 else None)
    means = np.array([summary["k"][k]["mean"] for k in ks])
    ci = np.array([summary["k"][k]["ci95"] for k in ks])
    ax.errorbar(x, means, yerr=[means - ci[:, 0], ci[:, 1] - means], fmt="o-", color="tab:blue", capsize=4,
                label=f"pooled, 95% CI ({summary['contexts']} contexts x {len(summary['per_seed'])} seeds)")
    ax.set_xticks(x)
    ax.set_xlabel("RPT iterations k (0 = NTP sampling)")
    ax.set_ylabel(f"TV(sampled joint of next {summary['window']}, truth)")
    d = summary["diff_1_0"]
    ax.set_title(f"k=1 - k=0: {d['mean']:+.4f}, 95% CI [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]", fontsize=9)
    ax.legend(fontsize=7)
    theory = summary["theory"]["curve"]
    bx.plot([t["measured_ratio"] for t in theory], [t["tv1_over_tv0"] for t in theory], "s-", color="tab:orange",
            label=f"Sec. 3 noise model on this source (eps_n = {summary['theory']['eps_n']})")
    colors = ("tab:blue", "tab:green", "tab:red", "tab:purple")
    for (label, s), color in zip([("this run", summary), *others], colors):
        for i, run in enumerate(s["per_seed"]):
            r = run["eps_ratios"]["prev_avg/next_avg"]
            bx.plot([r], [run["k"]["1"]["mean"] / run["k"]["0"]["mean"]], "o", color=color,
                    label=f"{label} (per seed)" if i == 0 else None)
    bx.axhline(1.0, color="black", linestyle="--", linewidth=1)
    bx.set_xlabel("eps_p / eps_n (true-law-weighted row TV errors of PTP and NTP)")
    bx.set_ylabel("TV_1 / TV_0 (below 1: RPT closer to the truth)")
    bx.legend(fontsize=7)
    fig.tight_layout()
    return fig
