"""rpt.training.measure."""
