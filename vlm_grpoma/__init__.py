"""vlm-grpoma: GRPO-MA training of Qwen-VL models for grounding and SAPIEN manipulation."""

__version__ = "0.1.0"
