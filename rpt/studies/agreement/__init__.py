"""rpt.studies.agreement.source."""
