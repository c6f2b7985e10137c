"""Findings from a summary, a timeline and the performance model."""
