"""The scaling study's protocol (``configs/scaling.yaml``): the sizes of the demo's Llama family,
their parameter counts, and per size and seed the two training runs (NTP pretraining, then the RPT
fine-tune) at a fixed number of tokens per parameter.

A size's batch is ``reference_batch`` sequences scaled by its parameter count relative to the
largest size (at least one sequence), and each stage's steps give it ``pretrain_share`` (or the
rest) of ``tokens_per_parameter x N`` training tokens (``batch x seq_len`` target tokens per step).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from rpt.studies.controlled.run import TrainJob

CONFIG = "configs/scaling.yaml"
VOCAB = 4096  # the demo's BPE (configs/tiny.yaml)
SEQ_LEN = 128


@dataclass(frozen=True)
class Size:
    """One Llama of the demo's family: tied embeddings, as many key/value heads as heads."""

    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int

    @property
    def name(self) -> str:
        return f"h{self.hidden_size}_l{self.num_hidden_layers}"

    def parameters(self, vocab: int = VOCAB) -> int:
        """The plain Llama's parameter count (the RPT offset table's 3 x hidden rows excluded):
        embedding (tied with the head), per layer q/k/v/o, the gated MLP and two norms, the final norm."""
        h = self.hidden_size
        per_layer = 4 * h * h + 3 * h * self.intermediate_size + 2 * h
        return vocab * h + self.num_hidden_layers * per_layer + h

    def overrides(self) -> list[str]:
        return [f"model.hidden_size={self.hidden_size}", f"model.num_hidden_layers={self.num_hidden_layers}",
                f"model.intermediate_size={self.intermediate_size}",
                f"model.num_attention_heads={self.num_attention_heads}",
                f"model.num_key_value_heads={self.num_attention_heads}"]


@dataclass(frozen=True)
class Design:
    sizes: tuple[Size, ...]
    tokens_per_parameter: float
    pretrain_share: float
    reference_batch: int
    pretrain_warmup_fraction: float
    finetune_warmup_fraction: float
    seeds: tuple[int, ...]
    pretrain_config: str
    finetune_config: str
    positions: int
    top_m: int
    excess_positions: int
    min_context: int
    context_len: int
    position_seed: int
    bootstrap_resamples: int
    # The registered prediction of the primary crossover, [low, high] in log10 parameters (null: unbounded).
    predicted_crossover_log10: tuple[float | None, float | None]

    @classmethod
    def load(cls, path: str | Path) -> Design:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - fields)
        missing = sorted(fields - set(raw))
        if unknown or missing:
            raise ValueError(f"{path}: unknown keys {unknown}, missing keys {missing}; the keys are {sorted(fields)}")
        raw["sizes"] = tuple(Size(**s) for s in raw["sizes"])
        raw["seeds"] = tuple(raw["seeds"])
        raw["predicted_crossover_log10"] = tuple(raw["predicted_crossover_log10"])
        design = cls(**raw)
        design.check()
        return design

    def check(self) -> None:
        counts = [s.parameters() for s in self.sizes]
        if len(self.sizes) < 2 or counts != sorted(counts) or len(set(counts)) != len(counts):
            raise ValueError("sizes: give at least two sizes in increasing parameter count")
        if not (self.tokens_per_parameter > 0 and 0 < self.pretrain_share < 1 and self.reference_batch >= 1):
            raise ValueError("need tokens_per_parameter > 0, 0 < pretrain_share < 1 and reference_batch >= 1")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def batch(self, size: Size) -> int:
        """Sequences per optimizer step: the reference batch scaled by the size's share of the largest."""
        return max(1, round(self.reference_batch * size.parameters() / self.sizes[-1].parameters()))

    def steps(self, size: Size) -> tuple[int, int]:
        """(pretrain, fine-tune) optimizer steps: each stage's share of ``tokens_per_parameter x N``."""
        per_step = self.batch(size) * SEQ_LEN
        total = self.tokens_per_parameter * size.parameters()
        pre = max(1, round(self.pretrain_share * total / per_step))
        return pre, max(1, round((1.0 - self.pretrain_share) * total / per_step))

    def training_tokens(self, size: Size) -> int:
        return sum(self.steps(size)) * self.batch(size) * SEQ_LEN


@dataclass(frozen=True)
class Model:
    """One size and training seed: its pretraining and fine-tune runs."""

    size: Size
    seed: int
    pretrain: TrainJob
    finetune: TrainJob

    @property
    def name(self) -> str:
        return f"{self.size.name}_s{self.seed}"


def plan(design: Design, seeds: Sequence[int], work: Path, tokenizer: str, sizes: int | None = None) -> list[Model]:
    """Every (size, seed) model's two runs under ``work`` (only the first ``sizes`` sizes when given,
    each trained exactly as in the whole design); the data order and initialisation follow the seed."""
    models = []
    for size in design.sizes[:sizes]:
        batch = design.batch(size)
        pre_steps, ft_steps = design.steps(size)
        common = [f"cache_dir={work / 'cache'}", f"global_batch_size={batch}", f"micro_batch_size={batch}"]
        for seed in seeds:
            name = f"{size.name}_s{seed}"
            pre = TrainJob(design.pretrain_config, work / "pretrain" / name,
                           [*size.overrides(), f"tokenizer={tokenizer}", *common, f"seed={seed}",
                            f"max_steps={pre_steps}", f"eval_every={pre_steps}",
                            f"warmup_steps={max(1, round(design.pretrain_warmup_fraction * pre_steps))}"])
            ft = TrainJob(design.finetune_config, work / "finetune" / name,
                          [f"init_from={pre.final}", *common, f"seed={seed}", f"max_steps={ft_steps}",
                           f"eval_every={ft_steps}",
                           f"warmup_steps={max(1, round(design.finetune_warmup_fraction * ft_steps))}"])
            models.append(Model(size, seed, pre, ft))
    return models
