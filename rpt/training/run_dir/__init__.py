"""The run directory's bookkeeping, one module per piece: :mod:`.lock` (one trainer per ``output_dir``),
:mod:`.file_checks` (the directory's own files usable before a run appends to them), :mod:`.resume` (where
a run starts: the checkpoint it resumes, or none), :mod:`.record` (``config.yaml`` once, ``segments.jsonl``
per invocation, the keys a resume may change) and :mod:`.log` (the start-up block and ``train.log``)."""
