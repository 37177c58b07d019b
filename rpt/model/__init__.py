"""The RPT model: :class:`RPTForCausalLM` (``wrapper``), the permuted-window objective
(``objective``, eqs. 9-10) and its loss (``loss``, eqs. 11-13), the no-padding mask, and LoRA.

``from rpt.model import RPTForCausalLM`` is a frozen path (docs/design.md, "Frozen paths"), so this
``__init__`` imports the wrapper; every other name is imported from its module.
"""

from rpt.model.wrapper import RPTForCausalLM

__all__ = ["RPTForCausalLM"]
