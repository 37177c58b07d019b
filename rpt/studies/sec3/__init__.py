"""Sec. 3 of the paper: the synthetic NTP-vs-RPT experiment, and the error measures with the noise model's
prediction."""
