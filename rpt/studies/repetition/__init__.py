"""Degenerate repetition: the detector, the study over samplers and penalties, and its inputs."""
