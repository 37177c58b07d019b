"""The pre-registered scaling study: its design, measures, fits, summary, report and runs."""
