"""Training: ``loop`` (:func:`~rpt.training.loop.run`) over ``setup`` (the run's accelerator, model,
optimizer and schedule), ``step`` (one optimizer step), ``validation`` and ``saving``; the run's config
(``config``, ``config_keys``) and its split into micro-batches (``micro_batch``), pre-flight checks,
DeepSpeed settings and compiled blocks; the run directory's bookkeeping (``run_dir``: lock, file checks,
where a run starts, its record and log) and a step's measurements (``measure``: metrics, plots, the GEMM
census, the step profile).

This ``__init__`` imports nothing, so ``train.py --help`` and the entry points that only check a
config or a path load neither torch nor accelerate.
"""
