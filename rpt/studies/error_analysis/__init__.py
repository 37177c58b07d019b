"""rpt.studies.error_analysis.analysis."""
