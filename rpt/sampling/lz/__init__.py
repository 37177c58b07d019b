"""rpt.sampling.lz.definition."""
