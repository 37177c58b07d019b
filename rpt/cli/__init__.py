"""The front of the scripts (``train.py``, ``sample.py``, ``prepare_data.py``, ``merge_lora.py``, ``eval/*.py``)
and of the library's entry points: what every command line shares.

* :mod:`rpt.cli.parser`       the one-line answer to bad input (``error: ...``, exit status 2) and the parser
                              whose own errors are one line too
* :mod:`rpt.cli.devices`      ``--device`` checked against this machine; ``--dtype``: the one list, resolved
* :mod:`rpt.cli.output_paths` the one check of an output path, before any work
* :mod:`rpt.cli.model_args`   the model flags (``--checkpoint``, ``--device``, ``--dtype``, ``--batch-size``,
                              ``--compile``), defined once
* :mod:`rpt.cli.sample`       ``sample.py``'s command
* :mod:`rpt.cli.study_command` a study command's shape (``eval/agreement.py``, ``eval/scaling.py``)

Nothing is imported here: reaching one module does not load its neighbours (``--help`` stays free of torch).
"""
