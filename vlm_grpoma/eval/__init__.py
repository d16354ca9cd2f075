"""Evaluation: grounding metrics, manipulation success, reports."""
