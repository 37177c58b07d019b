"""rpt.sampling.decode."""
