"""rpt.studies.controlled.experiment."""
