"""Placement engine and the baselines it is compared against."""
