"""Rollout on other devices or nodes: a vLLM engine behind HTTP (``service``, ``vlm-grpoma rollout-server``),
the trainer ranks' backend that samples from it and pushes weights to it (``client``, ``rollout.backend:
vllm_server``), and what travels between them (``wire``). Only ``service`` needs vLLM."""
