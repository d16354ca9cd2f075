"""``vlm-grpoma plan``: will a run config fit its GPUs? Parameter counts from the meta-device model, per-GPU
memory by formula (:mod:`~vlm_grpoma.planning.memory`), config checks against the architecture
(:mod:`~vlm_grpoma.planning.checks`), and the report with its verdict (:mod:`~vlm_grpoma.planning.report`)."""
