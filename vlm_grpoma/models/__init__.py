"""Qwen-VL model adapters (one per family), their registry, and tiny offline models."""
