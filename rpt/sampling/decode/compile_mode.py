r"""How the batch-flat decode steps are compiled: one place that picks ``torch.compile``'s mode.

On a CUDA device with the inductor backend, ``compile=True`` means CUDA graphs without a second flag:
``mode="reduce-overhead"`` (inductor's CUDA-graph trees) rather than an explicit ``torch.cuda.CUDAGraph``
around the compiled step. Both replay the whole step (model call over the static KV cache, processors,
proposals, event flags) as one graph launch; the trees also do what a hand-held graph would have to
re-implement and could get silently wrong: warm-up runs before capture, one memory pool shared by
the graphs of a decode (one per window shape), a re-record instead of a stale replay when a guard
fails (a new sampling config), and a check of every input's address, copying any that is not static
(the decode state and KV cache are static: :mod:`rpt.sampling.decode.state`, so nothing is copied).
The steps return nothing (their results are written into the state in place), so no graph output is
overwritten by the next replay while the host still holds it.

Elsewhere (the CPU, or a named backend) the step is compiled with that backend and no graphs.
``fullgraph=True`` everywhere: a graph break (a host synchronisation, an untraceable processor) is an
error, not a silent split of the step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rpt.decode_forward.compile_guard import guarded

# compiled steps run between two reads of the flags, per device type (1 elsewhere): on CUDA the host
# queues several graph replays while the device runs them, as gpt-fast and vLLM do (an NTP row that
# finishes inside the run is fed its pad id on the device; an RPT step queued after an event repeats
# its column and commits nothing). On the CPU a read costs nothing extra (the host runs every kernel
# itself) and a step past an event or every row's end would be wasted; tests set a CPU entry to run
# the CUDA path here.
STEPS_PER_TRANSFER = {"cuda": 8}


def steps_per_read(device: torch.device) -> int:
    """Compiled steps the batch-flat paths run between two host reads of the flags on ``device``."""
    return STEPS_PER_TRANSFER.get(device.type, 1)


def graphs_on(device: torch.device, backend) -> bool:
    """Whether steps compiled with ``backend`` on ``device`` replay as CUDA graphs."""
    return device.type == "cuda" and backend == "inductor"


def compile_step(fn: Callable, backend, device: torch.device) -> Callable:
    """``fn`` compiled for fixed shapes; replayed from a captured CUDA graph on CUDA with inductor. Any
    failure while it runs (tracing, compiling, capturing, replaying) raises
    :class:`~rpt.decode_forward.compile_guard.CompileFailure`, on which ``generate`` decodes eagerly."""
    if graphs_on(device, backend):
        return guarded(torch.compile(fn, mode="reduce-overhead", dynamic=False, fullgraph=True))
    return guarded(torch.compile(fn, backend=backend, dynamic=False, fullgraph=True))
