"""rpt.sampling.text."""
