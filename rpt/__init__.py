"""Corrector sampling (Resample-Previous-Tokens) and LZ-penalised sampling for HF causal LMs."""

__version__ = "0.1.0"
