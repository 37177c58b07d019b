"""rpt.studies.sec3."""
