"""Training: ``loop`` (:func:`~rpt.training.loop.run`) over ``build`` (the run's accelerator, model
and optimizer), ``step`` (one optimizer step), ``evaluation`` and ``saving``; the run's config
(``config``, ``config_keys``), its split into micro-batches, where it starts (``resume``), its record,
log, files and lock, pre-flight checks, DeepSpeed settings, compiled blocks, metrics, plots and the
measurements of a step (``gemm_census``, ``step_profile``).

This ``__init__`` imports nothing, so ``train.py --help`` and the entry points that only check a
config or a path load neither torch nor accelerate.
"""
