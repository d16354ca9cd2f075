"""``vlm-grpoma plan`` and the shipped configs: every config fits the GPUs its header names and agrees with
its real architecture (built on the meta device); the formulas agree with DeepSpeed's estimators and with
checkpoints actually written."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from vlm_grpoma.cli import main
from vlm_grpoma.config import load_config, validate
from vlm_grpoma.models.architecture import find_architecture, meta_model
from vlm_grpoma.models.families import FAMILIES
from vlm_grpoma.models.loading import prepare_trainable, vision_module_names
from vlm_grpoma.planning.memory import GIB, Hardware, estimate
from vlm_grpoma.planning.model_stats import model_stats
from vlm_grpoma.planning.report import checkpoint_size, header_hardware, make_plan

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "configs").rglob("*.yaml"))
TASKS = ("detection", "affordance", "trajectory", "manipulation")
#: The coordinate frame each family answers in: [0, extent] integers, or None for resized-image pixels.
FRAMES = {"qwen2_vl": 1000, "qwen2_5_vl": None, "qwen3_vl": 1000}


def test_configs_cover_every_task_and_family_with_two_sizes_where_released():
    names = {(p.parent.name, p.stem) for p in CONFIGS}
    for task in TASKS:
        for model in (
            "qwen2_vl_2b",
            "qwen2_vl_7b",
            "qwen2_5_vl_3b",
            "qwen2_5_vl_7b",
            "qwen3_vl_4b",
            "qwen3_vl_8b",
        ):
            assert (task, f"{model}_T4A4") in names, (task, model)


@pytest.mark.slow
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_plan_of_every_shipped_config_fits_the_gpus_its_header_names(path, capsys):
    hardware = header_hardware(path)
    assert hardware is not None, f"{path.name}: no '# Hardware: ...' header line"
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "verdict: fits" in out and "problem:" not in out
    assert "the config's # Hardware line" in out and "per-GPU memory" in out


@pytest.mark.slow
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_shipped_config_agrees_with_its_real_architecture(path):
    from qwen_vl_utils import smart_resize

    config = load_config(path)
    hardware = header_hardware(path)
    arch = find_architecture(config.model.name_or_path)
    assert arch is not None and path.parent.name == config.data.task
    assert config.rollout.backend == "vllm" and config.deepspeed.precision == "bf16"
    validate(config, hardware.world_size)  # batch arithmetic divides on the stated GPUs
    assert config.train.prompts_per_step // hardware.world_size >= 1
    model = prepare_trainable(meta_model(arch.transformers_config()), config.model)
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    vision = vision_module_names(model)
    assert not any(n.startswith(v + ".") or f".{v.rsplit('.', 1)[-1]}." in n for n in names for v in vision)
    text_layers = arch.transformers_config().get_text_config().num_hidden_layers
    if config.model.lora.enabled:  # every target exists in every decoder layer, nothing else trains
        adapted = [n for n, _ in model.named_modules() if n.endswith(".lora_A")]
        assert len(adapted) == len(config.model.lora.target_modules) * text_layers
        assert all(".lora_" in n for n in names)
    family = FAMILIES[arch.model_type]
    assert family.frame_spec.extent == FRAMES[arch.model_type]
    bounds = arch.processor
    assert bounds.min_pixels <= config.model.min_pixels < config.model.max_pixels <= bounds.max_pixels
    for width, height in ((640, 480), (336, 336), (1920, 1080)):  # what the model sees stays in bounds
        h, w = smart_resize(height, width, family.factor, config.model.min_pixels, config.model.max_pixels)
        assert h % family.factor == 0 and w % family.factor == 0
        assert config.model.min_pixels <= h * w <= config.model.max_pixels


@pytest.mark.parametrize(
    ("stage", "helper"),
    [
        (2, "stage_1_and_2:estimate_zero2_model_states_mem_needs"),
        (3, "stage3:estimate_zero3_model_states_mem_needs"),
    ],
)
def test_mixed_precision_states_are_deepspeeds_own_estimate(stage, helper):
    import importlib

    config = load_config(
        None,
        [
            "model.name_or_path=Qwen/Qwen2-VL-2B-Instruct",
            "model.freeze_vision=false",
            "algorithm.kl_beta=0",
            "deepspeed.precision=bf16",
            f"deepspeed.zero_stage={stage}",
            "train.prompts_per_step=8",
        ],
    )
    stats = model_stats(config)
    assert stats.trainable == stats.total == 2_208_985_600 and stats.largest_layer == 151936 * 1536
    hardware = Hardware(gpus_per_node=4, nodes=2, gpu_mem_gb=80)
    plan = estimate(config, stats, hardware)
    module, name = helper.split(":")
    function = getattr(importlib.import_module(f"deepspeed.runtime.zero.{module}"), name)
    args = (stats.total, stats.largest_layer) if stage == 3 else (stats.total,)
    result = function(*args, num_gpus_per_node=4, num_nodes=2, cpu_offload=False)
    assert plan.states["trainable: weights, grads, optimizer"] == result[1]
    assert plan.states["frozen weights"] == 0


def test_lora_counts_and_memory_formulas_by_hand():
    """Qwen2-VL-2B with LoRA r64 on the seven projections: T = 64 * sum(in + out) over 28 layers."""
    config = load_config(
        None,
        [
            "model.name_or_path=Qwen/Qwen2-VL-2B-Instruct",
            "model.lora.enabled=true",
            "model.lora.r=64",
            "model.lora.dropout=0",
            "model.gradient_checkpointing=true",
            "deepspeed.precision=bf16",
            "deepspeed.zero_stage=2",
            "train.prompts_per_step=4",
            "rollout.max_thought_tokens=100",
            "rollout.max_answer_tokens=20",
            "model.max_pixels=200704",  # 256 image tokens
        ],
    )
    stats = model_stats(config)
    h, kv, i = 1536, 256, 8960
    per_layer = 64 * ((h + h) * 2 + (h + kv) * 2 + (h + i) * 3)
    assert stats.trainable == 28 * per_layer == 73_859_072 and stats.lora_targets == 196
    plan = estimate(config, stats, Hardware(1, 1, 24))
    shape = plan.shapes
    assert shape.image_tokens == 256 and shape.prompt_tokens == 456
    assert shape.packed_row == 456 + 4 * 100 + 16 * 20
    tokens = shape.packed_row
    per_token = (8 + 4) * h + 2 * (h + kv) + 4 * h + 2 * h + 8 * i
    assert plan.training_pass["decoder activations"] == 28 * tokens * 2 * h + tokens * per_token
    assert plan.training_pass["logits"] == (tokens - 456 + 1) * 151936 * 10
    kv_bytes = 64 * (456 + 120) * 2 * 28 * 256 * 2  # 4 prompts x 16 paths, all layers, keys and values
    assert plan.rollout["rollout KV cache"] == kv_bytes
    assert plan.states["frozen weights"] == 2 * (stats.total - stats.trainable)


def test_checkpoint_size_formula_matches_the_tensors_a_checkpoint_writes(tiny_model_dir, tmp_path):
    """fp32 on CPU: the model/ weights and the DeepSpeed tensors come out as the plan says (LoRA and full)."""
    sys.path.insert(0, str(REPO / "tests" / "trainer"))
    from ds_worker import batch_ids, train_step
    from safetensors import safe_open

    from vlm_grpoma.trainer.checkpoint import TrainerState, save_checkpoint
    from vlm_grpoma.trainer.engine import build_engine

    tiny = tiny_model_dir("qwen2_5_vl")
    for stage, lora in ((0, True), (2, True), (2, False)):
        overrides = [
            f"model.name_or_path={tiny}",
            f"logging.output_dir={tmp_path / 'run'}",
            "train.prompts_per_step=4",
            "train.micro_batch_prompts=2",
            "algorithm.kl_beta=0",
            f"deepspeed.zero_stage={stage}",
            f"model.lora.enabled={str(lora).lower()}",
            "model.lora.r=4",
        ]
        config = load_config(None, overrides)
        engine = build_engine(config)
        train_step(engine, batch_ids(0, 0, 4))
        saved = save_checkpoint(engine, tmp_path / f"run-{stage}-{lora}", TrainerState(step=1))
        engine.close()
        expected = checkpoint_size(config, model_stats(config), w=4)
        weights = 0
        for file in (saved / "model").glob("*.safetensors"):
            with safe_open(str(file), "pt") as f:
                weights += sum(f.get_tensor(k).numel() * 4 for k in f.keys())  # noqa: SIM118
        assert weights == expected.model, (stage, lora)
        tensors = sum(
            _tensor_bytes(torch.load(f, weights_only=False)) for f in (saved / "deepspeed").rglob("*.pt")
        )
        assert expected.deepspeed <= tensors <= expected.deepspeed + 1024, (stage, lora, tensors)


def _tensor_bytes(value, seen: set | None = None) -> int:
    """Bytes of the distinct tensor storages inside nested containers (torch.save writes a shared one once)."""
    seen = set() if seen is None else seen
    if isinstance(value, torch.Tensor):
        key = (value.untyped_storage().data_ptr(), value.untyped_storage().nbytes())
        if key in seen:
            return 0
        seen.add(key)
        return value.untyped_storage().nbytes()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v, seen) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v, seen) for v in value)
    return 0


def test_a_config_that_does_not_fit_names_the_first_knob_that_makes_it_fit(capsys):
    path = REPO / "configs" / "detection" / "qwen2_5_vl_7b_T4A4.yaml"
    assert main(["plan", str(path), "--gpus", "1"]) == 1
    out = capsys.readouterr().out
    assert "verdict: does not fit, short by" in out and "(command line)" in out
    report = make_plan(load_config(path), Hardware(1, 1, 80))
    assert not report.memory.fits and report.knob is not None and report.knob.plan.fits
    assert f"first knob: {report.knob.override} -> peak" in out
    # the knob's plan is an ordinary plan of the changed config
    changed = load_config(path, [report.knob.override])
    assert estimate(changed, model_stats(changed), Hardware(1, 1, 80)).total == report.knob.plan.total


def test_hardware_comes_from_the_header_line_unless_flags_say_otherwise(tmp_path, capsys):
    text = (REPO / "configs" / "detection" / "qwen2_vl_2b_T4A4.yaml").read_text()
    path = tmp_path / "two-nodes.yaml"
    path.write_text(
        text.replace("# Hardware: 1 GPU x 24 GB", "# Hardware: 2 nodes x 4 GPUs x 48 GB").replace(
            "prompts_per_step: 16", "prompts_per_step: 32"
        )
    )
    assert header_hardware(path) == Hardware(gpus_per_node=4, nodes=2, gpu_mem_gb=48.0)
    assert main(["plan", str(path)]) == 0
    assert "2 node(s) x 4 GPU(s) x 48 GB (the config's # Hardware line)" in capsys.readouterr().out
    assert main(["plan", str(path), "--gpus", "8", "--nodes", "1", "--gpu-mem", "80"]) == 0
    out = capsys.readouterr().out
    assert "1 node(s) x 8 GPU(s) x 80 GB (command line)" in out and "4 prompts per GPU" in out


def test_contradictions_with_the_architecture_are_reported_one_line_each(capsys):
    path = REPO / "configs" / "detection" / "qwen2_vl_2b_T4A4.yaml"
    overrides = [
        "model.lora.target_modules=[q_proj, qkv]",
        "model.max_pixels=20000000",
        "rollout.vllm.max_model_len=512",
    ]
    assert main(["plan", str(path), *overrides]) == 1
    problems = [line for line in capsys.readouterr().out.splitlines() if line.startswith("problem: ")]
    assert problems == [
        "problem: model.lora.target_modules: qkv name no linear layer of the language model (it has "
        "down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj)",
        "problem: model.max_pixels: 20000000 exceeds the checkpoint processor's 12845056",
        "problem: rollout.vllm.max_model_len: 512 is shorter than prompt + thought + answer "
        f"({20000000 // 784 + 200 + 256 + 64} tokens)",
    ]


def test_plan_of_a_local_tiny_model_on_cpu(tiny_model_dir):
    config = load_config(
        REPO / "vlm_grpoma" / "configs" / "demo_detection.yaml",
        [f"model.name_or_path={tiny_model_dir('qwen3_vl')}"],
    )
    report = make_plan(config, Hardware(1, 1, 4, device="cpu"))
    assert report.memory.precision == "fp32" and report.memory.reserve == 0 and report.memory.fits
    assert report.stats.source.endswith("config.json") and not report.problems
    assert report.memory.total < 0.5 * GIB


def test_the_scaling_guide_and_help_state_the_plans_assumptions(capsys):
    from vlm_grpoma.planning.assumptions import ASSUMPTIONS

    assert ASSUMPTIONS.strip() in (REPO / "docs" / "scaling.md").read_text()
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    assert "estimate_zero3_model_states_mem_needs" in capsys.readouterr().out


def test_flex_attention_plans_the_block_mask_and_token_budgets_the_micro_batch(tiny_model_dir, tmp_path):
    """The Flex mask term is the bytes a real BlockMask of the packed rows holds (block tables + segment
    table), far below the dense (w + 4) L^2; a token budget sets the micro-batch's prompts."""
    from tests.trainer.test_packed import _load, _prompts, _ragged_tree
    from vlm_grpoma.planning.memory import mask_bytes
    from vlm_grpoma.trainer.packed import block_mask, pack

    overrides = ["model.name_or_path=Qwen/Qwen2-VL-2B-Instruct", "deepspeed.precision=bf16"]
    overrides += ["train.prompts_per_step=8", "rollout.max_thought_tokens=400", "model.max_pixels=802816"]
    dense = load_config(None, overrides)
    flex = load_config(None, [*overrides, "model.attn_implementation=flex_attention"])
    plans = [estimate(c, model_stats(c), Hardware(1, 1, 80)) for c in (dense, flex)]
    row = plans[0].shapes.packed_row
    assert row > 2048 and plans[0].training_pass["attention mask"] == 6 * row**2
    assert plans[1].training_pass["attention mask"] < plans[0].training_pass["attention mask"] / 100
    assert plans[1].total < plans[0].total

    model, adapter = _load(tiny_model_dir, "qwen2_vl", lora=False)
    tree = _ragged_tree(_prompts(adapter, tmp_path), adapter.tokens, k=4, m=3, seed=9)
    packed = pack(model, tree, [0, 1, 2], adapter.tokens)
    n, total = packed.input_ids.shape
    built = block_mask(packed, torch.device("cpu"), block=16)
    tables = [built.kv_num_blocks, built.kv_indices, built.full_kv_num_blocks, built.full_kv_indices]
    tables += [built.q_num_blocks, built.q_indices, built.full_q_num_blocks, built.full_q_indices]
    held = sum(t.numel() * t.element_size() for t in tables)
    blocks = -(-total // 16)
    segments = n * blocks * 16 * (1 + 8 + 8)  # valid, thought_of, answer_of, padded to whole blocks
    assert mask_bytes(flex, n, total, 2, block=16) == held + segments

    budget = load_config(
        None, [*overrides, f"train.micro_batch_tokens={3 * row}", "train.micro_batch_prompts=8"]
    )
    plan = estimate(budget, model_stats(budget), Hardware(1, 1, 80))
    assert plan.training_pass["attention mask"] == 3 * 6 * row**2  # three packed rows fit the budget


def test_adaptive_answers_are_planned_at_their_budget_not_at_answers_per_thought():
    """With rollout.adaptive_answers on, a prompt trains on `budget` answers whatever answers_per_thought says:
    budget 16 over K=4 plans as uniform K=4, M=4 (both passes); budget 8 as M=2 (packed row, KV cache)."""
    base = [
        "model.name_or_path=Qwen/Qwen2-VL-2B-Instruct",
        "deepspeed.precision=bf16",
        "rollout.num_thoughts=4",
    ]
    adaptive = ["rollout.adaptive_answers.enabled=true", "rollout.answers_per_thought=1"]

    def plan(*overrides):
        config = load_config(None, [*base, *overrides])
        return estimate(config, model_stats(config), Hardware(1, 1, 80))

    for logprob_pass in ("shared", "naive"):
        uniform = plan("rollout.answers_per_thought=4", f"train.logprob_pass={logprob_pass}")
        budget = plan(*adaptive, "rollout.adaptive_answers.budget=16", f"train.logprob_pass={logprob_pass}")
        assert budget.shapes == uniform.shapes
        assert budget.training_pass == uniform.training_pass and budget.rollout == uniform.rollout
    small = plan(*adaptive, "rollout.adaptive_answers.budget=8", "rollout.adaptive_answers.max_per_thought=4")
    two = plan("rollout.answers_per_thought=2")
    assert small.shapes == two.shapes and small.rollout == two.rollout
