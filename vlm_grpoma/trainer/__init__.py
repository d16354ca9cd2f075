"""The DeepSpeed GRPO-MA trainer: engine, loop, checkpoints, logging."""
