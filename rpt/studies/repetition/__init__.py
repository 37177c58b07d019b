"""rpt.studies.repetition.metric."""
