"""Bad user input, by kind: every class is an :class:`InputError` (a ``ValueError``), which the scripts
answer with one ``error: ...`` line and exit status 2 (:func:`rpt.cli.parser.report_input_error`).

Each message names the problem and the fix. The classes sit in the base layer so that any layer may
raise them; each is also reachable where its users catch it (``rpt.data.DataError``,
``rpt.checkpoint.model_ref.ModelRefError``, ...).
"""


class InputError(ValueError):
    """Bad input from a user (a flag, a file, a setting, a request): the message names it and the fix."""


class ConfigError(InputError):
    """A bad configuration: the message names the key and the fix."""


class DataError(InputError):
    """A data source that cannot be read: the message names it and the fix."""


class CheckpointError(InputError):
    """A checkpoint file that cannot be trusted or read: the message names the file and the fix."""


class ModelRefError(InputError):
    """A model reference that does not name a loadable model; the message says why and the fix."""


class ChatTemplateError(InputError):
    """A chat template that cannot be applied (one line: the tokenizer, the template, jinja's message)."""


class RPTSettingError(InputError):
    """A request's RPT settings cannot be served (the message names the key and the fix)."""


class EvalInputError(InputError):
    """Bad evaluation input: a missing file, a malformed line, a wrong or missing field."""


class ModelArgsError(InputError):
    """A bad ``--model_args`` value; the message names the key and the fix."""
