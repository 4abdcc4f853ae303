"""Simulation: replay job traces on modelled clusters through the placement engine."""
