"""rpt.studies.scaling."""
