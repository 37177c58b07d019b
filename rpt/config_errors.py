"""``ConfigError``: a bad training configuration (a leaf module, as :mod:`rpt.data.errors` holds ``DataError``).

:mod:`rpt.training.config` (the dataclass and its validation) and :mod:`rpt.training.config_keys` (the key checks it
calls) both raise it, so it lives below both of them.
"""


class ConfigError(ValueError):
    """A bad configuration: the message names the key and the fix."""
