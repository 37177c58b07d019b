"""`SamplingConfig`: every decoding knob in one validated place.

NTP proposals are shaped by penalties (repetition, frequency/presence, LZ) and then by the warpers
(temperature, top-k, top-p, min-p); ``temperature == 0`` means greedy (the warpers are skipped).
RPT (``rpt_iters > 0``) revisits the last ``rpt_window`` tokens with previous-token prediction and
accepts a proposal only when its post-penalty probability exceeds ``confidence``.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field


def _is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(float(x))


_INT_RULES = (  # one rule per field
    (("max_new_tokens", "lz_window", "lz_buffer"), 1, "use an integer >= 1"),
    (("rpt_window",), 2, "RPT revisits at least one previous token: use an integer >= 2 (2 or 3)"),
    (("top_k", "rpt_iters"), 0, "use an integer >= 0 (0 turns it off)"),
)
# The LZ window and match lengths are allocated as [W] / [B + 1, W] tensors (rpt/sampling/lz/definition.py): a
# typo like 10**12 must be one error, not an allocation failure. 65536 tokens covers any context
# this sampler decodes; the reference penalizer uses 512 and 32.
_INT_MAXIMA = {"lz_window": 65536, "lz_buffer": 256}
# RPT's work per new token: k sweeps, each re-proposing the window's w tokens (w - 1 PTP proposals and x_t's
# NTP re-proposal), each sweep that changes a token a model call of its own, and k + 1 NTP draws kept per
# query. No count of sweeps is "enough" for sampled decoding (each one redraws), so the bound is one of cost:
# at most 256 proposals per new token (k * w <= 256: k <= 128 at w = 2, 85 at w = 3), a decode at most a few
# hundred times NTP's work; the paper's k is 1-3. A typo (2e9, 10**6) is one error, not a 48 GB allocation.
MAX_PROPOSALS_PER_TOKEN = 256
_RANGE_RULES = (
    ("temperature", lambda v: v >= 0, "use 0 for greedy decoding or a positive temperature"),
    ("top_p", lambda v: 0 < v <= 1, "use a value in (0, 1]; 1 turns top-p off"),
    ("min_p", lambda v: 0 <= v <= 1, "use a value in [0, 1]; 0 turns min-p off"),
    ("confidence", lambda v: 0 <= v <= 1, "use a probability in [0, 1] (paper default 0.9)"),
    ("repetition_penalty", lambda v: v > 0, "use a value > 0; 1 turns it off, > 1 discourages repeats"),
    ("frequency_penalty", lambda v: -2 <= v <= 2, "use a value in [-2, 2] (OpenAI range); 0 turns it off"),
    ("presence_penalty", lambda v: -2 <= v <= 2, "use a value in [-2, 2] (OpenAI range); 0 turns it off"),
    ("lz_penalty", lambda v: v >= 0, "use alpha >= 0; 0 turns it off, paper default 0.15"),
)
_FLOAT_KNOBS = ("temperature", "top_p", "min_p", "confidence", "repetition_penalty", "frequency_penalty",
                "presence_penalty", "lz_penalty")
# A compiled decode step reads these knobs from a tensor (DecodeState.knobs, in this order), so that a sweep
# over their values runs one graph (a Python float in the traced code is a constant: a graph per value).
# What the builders decide from a value -- greedy or not, whether a processor exists -- stays in the
# traced config: each knob's neutral values are kept, any other value becomes its stand-in.
TENSOR_KNOBS = _FLOAT_KNOBS
_NEUTRAL = {"temperature": (0.0, 1.0), "top_p": (1.0,), "min_p": (0.0,), "confidence": (), "repetition_penalty": (1.0,),
            "frequency_penalty": (0.0,), "presence_penalty": (0.0,), "lz_penalty": (0.0,)}
_STAND_IN = {"temperature": 0.5, "top_p": 0.5, "min_p": 0.5, "confidence": 0.5, "repetition_penalty": 2.0,
             "frequency_penalty": 1.0, "presence_penalty": 1.0, "lz_penalty": 1.0}


@dataclass
class SamplingConfig:
    """Decoding knobs, validated at construction (and on :meth:`validate`); the defaults are greedy NTP.

    Args:
        max_new_tokens: tokens to generate per row (fewer when the context runs out).
        temperature, top_k, top_p, min_p: the warpers; ``temperature=0`` is greedy, ``top_k=0``,
            ``top_p=1`` and ``min_p=0`` are off.
        rpt_iters: RPT iterations ``k`` per new token; 0 is plain NTP sampling.
        rpt_window: ``w``, the tokens each iteration revisits (2 or 3, at most the trained window).
        ptp_greedy: take the PTP proposal's argmax (else sample it).
        confidence: ``eta``; a PTP proposal replaces a token when its probability exceeds it.
        repetition_penalty, frequency_penalty, presence_penalty: CTRL's (1 is off) and OpenAI's (0 is
            off) penalties.
        lz_penalty, lz_window, lz_buffer, lz_include_prompt, lz_variant: the LZ penalty's ``alpha``
            (0 is off, the paper uses 0.15), window, look-ahead buffer, whether the window covers the
            prompt, and which reference version (``"codelength"`` or ``"closest_longest"``).
        penalize_ptp: a PTP proposal for ``x_j`` gets the processors NTP had at position ``j``.
        token_healing: back the prompt up over its last tokens where a vocabulary token spans its end, and
            make the first new tokens re-spell the removed bytes (:mod:`rpt.sampling.text.healing`).
        stop: strings that end a row (needs the tokenizer).
        eos_token_id: an id or list of ids; ``None`` the model's and the tokenizer's; ``[]`` never.
        seed: keys every random draw (``None``: fresh draws).

    Raises:
        ValueError: one line naming the first invalid field and the fix.

    Example:
        >>> from rpt.sampling import SamplingConfig
        >>> config = SamplingConfig(max_new_tokens=64, rpt_iters=1, rpt_window=2, temperature=0.8,
        ...                         lz_penalty=0.15, seed=0)
        >>> config.greedy, config.repetition_penalty
        (False, 1.0)
        >>> SamplingConfig(top_p=0)
        Traceback (most recent call last):
        ...
        ValueError: SamplingConfig.top_p=0.0 is invalid: use a value in (0, 1]; 1 turns top-p off
    """

    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    rpt_iters: int = 0  # k; 0 = plain NTP sampling
    rpt_window: int = 2  # w: previous tokens revisited, at most the trained window
    ptp_greedy: bool = True
    confidence: float = 0.9  # eta: accept a PTP proposal when its probability exceeds this
    repetition_penalty: float = 1.0  # CTRL form; 1 = off
    frequency_penalty: float = 0.0  # OpenAI form over generated tokens; 0 = off
    presence_penalty: float = 0.0  # OpenAI form over generated tokens; 0 = off
    lz_penalty: float = 0.0  # alpha; 0 = off, paper default 0.15
    lz_window: int = 512
    lz_buffer: int = 32
    lz_include_prompt: bool = False  # window over generated tokens only, as the reference penalizer
    lz_variant: str = "codelength"  # or "closest_longest": the two reference versions (rpt/sampling/lz/definition.py)
    penalize_ptp: bool = True  # PTP proposals for x_j get the processors NTP had at position j
    token_healing: bool = False
    stop: list[str] = field(default_factory=list)
    eos_token_id: int | list[int] | None = None  # None: the model's generation_config, else the tokenizer's; []: none
    seed: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, tuple):
            self.stop = list(self.stop)
        if isinstance(self.eos_token_id, tuple):
            self.eos_token_id = list(self.eos_token_id)
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field and how to fix it (ints given for float knobs,
        e.g. ``repetition_penalty=2``, become floats: Hugging Face's processors require floats)."""
        for names, low, fix in _INT_RULES:
            for name in names:
                if not _is_int(getattr(self, name)) or getattr(self, name) < low:
                    raise self._bad(name, fix)
        for name, high in _INT_MAXIMA.items():
            if getattr(self, name) > high:
                raise self._bad(name, f"use an integer in [1, {high}] (the paper's window is 512, its buffer 32)")
        if self.rpt_window > MAX_PROPOSALS_PER_TOKEN:
            raise self._bad("rpt_window", f"use an integer in [2, {MAX_PROPOSALS_PER_TOKEN}] (2 or 3 as in the paper; "
                                          f"a decode's window is at most the model's trained one)")
        if self.rpt_iters * self.rpt_window > MAX_PROPOSALS_PER_TOKEN:
            high = MAX_PROPOSALS_PER_TOKEN // self.rpt_window
            raise self._bad("rpt_iters", f"with rpt_window={self.rpt_window} use an integer in [0, {high}] "
                                         f"(rpt_iters x rpt_window <= {MAX_PROPOSALS_PER_TOKEN} proposals per new "
                                         f"token; the paper uses 1-3)")
        for name in _FLOAT_KNOBS:
            if not _is_real(getattr(self, name)):
                raise self._bad(name, "use a finite number")
            setattr(self, name, float(getattr(self, name)))
        for name, ok, fix in _RANGE_RULES:
            if not ok(getattr(self, name)):
                raise self._bad(name, fix)
        self._check_flags_and_lists()

    def _bad(self, name: str, fix: str) -> ValueError:
        return ValueError(f"SamplingConfig.{name}={getattr(self, name)!r} is invalid: {fix}")

    def _check_flags_and_lists(self) -> None:
        for name in ("ptp_greedy", "lz_include_prompt", "penalize_ptp", "token_healing"):
            if not isinstance(getattr(self, name), bool):
                raise self._bad(name, "use True or False")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise self._bad("stop", "use a list of non-empty strings, e.g. stop=['\\n\\n']")
        eos = self.eos_token_id
        eos_ids = eos if isinstance(eos, list) else [] if eos is None else [eos]
        if not all(_is_int(i) and i >= 0 for i in eos_ids):
            raise self._bad("eos_token_id", "use None, a token id >= 0, or a list of token ids")
        if self.lz_variant not in ("codelength", "closest_longest"):
            raise self._bad("lz_variant", "use codelength (the per-token LZSS cost, default) or closest_longest")
        if self.seed is not None and not _is_int(self.seed):
            raise self._bad("seed", "use None or an integer")

    @property
    def greedy(self) -> bool:
        """NTP takes the argmax of the processed logits (no warpers, no randomness)."""
        return self.temperature == 0

    @property
    def deterministic(self) -> bool:
        """The whole decode is a function of the prompt: greedy NTP (which makes PTP greedy too)."""
        return self.greedy

    def with_default_eos(self, model=None, tokenizer=None) -> SamplingConfig:
        """This config, with ``eos_token_id=None`` replaced by the model's EOS ids
        (``generation_config.eos_token_id``, what Hugging Face's ``generate`` stops at) and the
        tokenizer's ``eos_token_id``, all of them (none known: ``[]``). A config with an EOS set
        (``[]`` included: never stop at EOS) is returned as is."""
        if self.eos_token_id is not None:
            return self
        found: list = []
        for owner in (model, getattr(model, "lm", None)):  # an RPTForCausalLM keeps it on its base model
            found.append(getattr(getattr(owner, "generation_config", None), "eos_token_id", None))
        found.append(getattr(tokenizer, "eos_token_id", None))
        ids: list[int] = []
        for eos in found:
            for i in eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos]:
                if int(i) not in ids:
                    ids.append(int(i))
        return dataclasses.replace(self, eos_token_id=ids)

    def knob_values(self) -> list[float]:
        """The :data:`TENSOR_KNOBS` values, in order (what a compiled step's knob tensor holds)."""
        return [getattr(self, name) for name in TENSOR_KNOBS]

    def traced(self) -> SamplingConfig:
        """This config as a compiled step traces it: each :data:`TENSOR_KNOBS` value that is not neutral
        replaced by a stand-in with the same consequences for the processors built (the step reads the
        value from its knob tensor), so configs that differ only in those values share one graph."""
        return dataclasses.replace(self, **{name: getattr(self, name) if getattr(self, name) in _NEUTRAL[name]
                                            else _STAND_IN[name] for name in TENSOR_KNOBS})

    @property
    def eos_token_ids(self) -> list[int]:
        """``eos_token_id`` as a (possibly empty) list."""
        eos = self.eos_token_id
        return list(eos) if isinstance(eos, list) else [] if eos is None else [int(eos)]
