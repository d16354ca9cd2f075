"""GRPO-MA vs GRPO, end to end at CPU scale (``python benchmarks/compare.py``): plan, commands, report."""
