"""The controlled experiment's source (docs/controlled_experiment.md): the fixed :class:`Design`
of the hidden Markov model and of the evaluation, chosen before any model was trained, and its
samples, HMM and one-symbol-per-token tokenizer written for ``train.py``. The agreement study
writes its own source through the same writers."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field

import numpy as np

from rpt.result_files import write_atomic
from rpt.studies.controlled import hmm as hmm_lib

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
    write_atomic(path, "".join(json.dumps({"text": " ".join(symbol(int(t)) for t in row)}) + "\n" for row in rows))


def write_tokenizer(path: str, vocab: int) -> None:
    """:func:`symbol_tokenizer` saved to ``path`` (written beside it, then renamed into place)."""
    tmp = f"{path}.{os.getpid()}.tmp"  # a directory, not a file (write_atomic): renamed whole into place
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
    write_atomic(files.hmm, json.dumps({"design": design.to_dict(), "hmm": hmm.to_dict()}, indent=1))
    return files

