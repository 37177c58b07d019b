"""Serving-engine integrations (each module imports its engine; nothing else in rpt imports them)."""
