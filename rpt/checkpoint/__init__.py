"""The checkpoint directory and what reads it, below every layer that opens a checkpoint.

``directories`` (atomic directories, discovery, pruning, the manifest, plain-data reads),
``rpt_config`` (the one reader of ``rpt_config.json`` and the offset table), ``faithful`` (format 2:
the NTP row folded into the input embedding), ``model_ref`` (what a model reference names) and
``custom_generate`` (the files transformers runs from a checkpoint). It imports nothing of ``rpt``
above the shared top modules, so data, the model, sampling and training all read checkpoints
through it. This ``__init__`` imports nothing.
"""
