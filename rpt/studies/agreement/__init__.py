"""The agreement-pairs study: its source, the models scored against it, the registered predictions, the
decomposition of the gap, its runs and results."""
