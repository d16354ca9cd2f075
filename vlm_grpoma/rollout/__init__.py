"""Two-phase K x M rollout: the RolloutTree, the backend protocol, transformers and vLLM backends."""
