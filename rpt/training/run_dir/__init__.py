"""rpt.training.run_dir."""
