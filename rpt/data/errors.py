"""The one error type of the data pipeline."""


class DataError(ValueError):
    """A data source that cannot be read: the message names it and the fix."""
