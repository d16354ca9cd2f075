"""Simulated environments."""
