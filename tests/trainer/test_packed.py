"""The shared-prefix pass reproduces the naive path log-probs and their parameter gradients, every family."""

import pytest
import torch
from PIL import Image

from tests.trainer.pass_agreement import assert_shared_equals_naive
from vlm_grpoma.answers import Box, Boxes
from vlm_grpoma.config import ModelConfig
from vlm_grpoma.datasets.schema import Record, ShortAnswer
from vlm_grpoma.errors import ConfigError
from vlm_grpoma.models.attention import BLOCK_MASK_ATTENTION, FLEX_ATTENTION
from vlm_grpoma.models.loading import load_model
from vlm_grpoma.rollout.hf import HFRolloutEngine
from vlm_grpoma.rollout.tree import RolloutTree
from vlm_grpoma.sampling import SamplingParams
from vlm_grpoma.trainer.grpo_ma import GRPOMATrainer, refuse_flex_training_on_cpu
from vlm_grpoma.trainer.packed import allowed, block_mask, pack, shared_prefix_log_probs

SIZES = [(90, 70), (50, 120), (112, 112)]


def _prompts(adapter, folder):
    """Three prompts of different image sizes and text lengths (so the batch is padded)."""
    records = []
    for i, (w, h) in enumerate(SIZES):
        Image.new("RGB", (w, h), (60 * i, 120, 200)).save(folder / f"{i}.png")
        records.append(
            Record(
                id=f"r{i}",
                image=str(folder / f"{i}.png"),
                task="detection",
                prompt="the square" + " on the left" * i,
                width=w,
                height=h,
                ground_truth=Boxes((Box(1, 1, 9, 9),)),
            )
        )
    prompts = adapter.build_inputs(records)
    assert len({len(p.input_ids) for p in prompts}) == 3
    return prompts


def _ragged_tree(prompts, tokens, k=3, m=2, lt=7, la=5, seed=0) -> RolloutTree:
    """A tree of random text tokens with thoughts (closed by ``</think>``) and answers of random lengths."""
    g = torch.Generator().manual_seed(seed)
    b = len(prompts)
    close = torch.tensor(tokens.think_close)
    thought_ids = torch.full((b, k, lt), tokens.pad_id)
    thought_mask = torch.zeros((b, k, lt), dtype=torch.bool)
    answer_ids = torch.full((b, k, m, la), tokens.pad_id)
    answer_mask = torch.zeros((b, k, m, la), dtype=torch.bool)
    text_ids = torch.arange(3, 200)  # plain text tokens of the tiny BPE vocabulary
    for i in range(b):
        for j in range(k):
            n = int(torch.randint(len(close), lt + 1, (1,), generator=g))
            thought_ids[i, j, :n] = torch.cat(
                [text_ids[torch.randint(len(text_ids), (n - len(close),), generator=g)], close]
            )
            thought_mask[i, j, :n] = True
            for r in range(m):
                n = int(torch.randint(1, la + 1, (1,), generator=g))
                answer_ids[i, j, r, :n] = text_ids[torch.randint(len(text_ids), (n,), generator=g)]
                answer_mask[i, j, r, :n] = True
    return RolloutTree(
        prompts,
        tokens.pad_id,
        thought_ids,
        thought_mask,
        torch.zeros(b, k, lt),
        [["stop"] * k] * b,
        [[""] * k] * b,
        answer_ids,
        answer_mask,
        torch.zeros(b, k, m, la),
        [[["stop"] * m] * k] * b,
        [[[""] * m] * k] * b,
    )


def _load(tiny_model_dir, arch, lora: bool, attn: str = "sdpa"):
    loaded = load_model(
        ModelConfig(name_or_path=str(tiny_model_dir(arch)), dtype="float32", attn_implementation=attn)
    )
    model = loaded.model.eval()
    if lora:
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(0)  # non-zero LoRA B (init_lora_weights=False), so the adapters change the outputs
        model = get_peft_model(
            model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        )
    return model, loaded.adapter


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_ragged_tree_matches_naive(arch, lora, tiny_model_dir, tmp_path):
    model, adapter = _load(tiny_model_dir, arch, lora)
    prompts = _prompts(adapter, tmp_path)
    tree = _ragged_tree(prompts, adapter.tokens)
    assert (
        len(set(tree.thought_lengths.flatten().tolist())) > 2
        and len(set(tree.answer_lengths.flatten().tolist())) > 2
    )
    assert_shared_equals_naive(model, tree, [0, 1, 2], adapter.tokens)


def test_sampled_tree_with_truncated_thoughts_matches_naive(arch, tiny_model_dir, tmp_path):
    model, adapter = _load(tiny_model_dir, arch, lora=False)
    params = SamplingParams(
        num_thoughts=2, answers_per_thought=3, max_thought_tokens=4, max_answer_tokens=4, seed=5
    )
    tree = HFRolloutEngine.for_adapter(model, adapter).sample(_prompts(adapter, tmp_path), params)
    assert tree.thought_truncated.any()
    assert_shared_equals_naive(model, tree, [2, 0], adapter.tokens)  # any subset, any order
    with torch.no_grad():  # and the recorded sampling log-probs, as the naive pass reproduces them
        shared = shared_prefix_log_probs(model, tree, [0, 1, 2], adapter.tokens)
    torch.testing.assert_close(shared.answer, tree.answer_logprobs * tree.answer_mask, atol=1e-4, rtol=0)


def _answer_prompts(adapter, folder, pictured: bool):
    """Short-answer prompts of different lengths: text-only, or with a pictured one between two text-only."""
    Image.new("RGB", (90, 70), (10, 200, 90)).save(folder / "a.png")
    text = [
        Record(f"t{i}", None, "answer", "What is 2+3" + " plus 4" * i + "?", None, None, ShortAnswer("5"))
        for i in range(2)
    ]
    image = Record("p", str(folder / "a.png"), "answer", "How many squares?", 90, 70, ShortAnswer("1"))
    prompts = adapter.build_inputs([text[0], image, text[1]] if pictured else text)
    assert [p.pixel_values is not None for p in prompts] == (
        [False, True, False] if pictured else [False] * 2
    )
    return prompts


@pytest.mark.parametrize("pictured", [False, True], ids=["text-only", "mixed"])
def test_answer_prompts_text_only_and_mixed_match_naive(arch, pictured, tiny_model_dir, tmp_path):
    """No pixel inputs for text-only rows; in a mixed batch the pictured prompt's image stays its own."""
    model, adapter = _load(tiny_model_dir, arch, lora=False)
    if not pictured:  # text-only rows never reach the vision tower: it has no gradient to compare
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(".visual." not in f".{name}")
        assert any(not p.requires_grad for p in model.parameters())
    prompts = _answer_prompts(adapter, tmp_path, pictured)
    tree = _ragged_tree(prompts, adapter.tokens, seed=4)
    assert (pack(model, tree, [0], adapter.tokens).vision == {}) and (
        ("pixel_values" in pack(model, tree, range(len(prompts)), adapter.tokens).vision) is pictured
    )
    assert_shared_equals_naive(model, tree, list(range(len(prompts))), adapter.tokens)
    if pictured:  # the pictured prompt's rows next to text-only ones score as in a batch of their own
        alone = shared_prefix_log_probs(model, tree, [1], adapter.tokens)
        together = shared_prefix_log_probs(model, tree, [0, 1, 2], adapter.tokens)
        torch.testing.assert_close(together.answer[1], alone.answer[0], atol=1e-5, rtol=0)


def test_eager_attention_matches_naive(tiny_model_dir, tmp_path):
    model, adapter = _load(tiny_model_dir, "qwen2_5_vl", lora=False, attn="eager")
    prompts = _prompts(adapter, tmp_path)
    assert_shared_equals_naive(model, _ragged_tree(prompts, adapter.tokens, seed=2), [1, 2], adapter.tokens)


def test_each_prompt_and_thought_is_packed_once(tiny_model_dir, tmp_path):
    model, adapter = _load(tiny_model_dir, "qwen2_vl", lora=False)
    prompts = _prompts(adapter, tmp_path)
    tree = _ragged_tree(prompts, adapter.tokens, k=4, m=3)
    packed = pack(model, tree, [0, 1, 2], adapter.tokens)
    branch = tree.thought_lengths.sum(1) + tree.answer_lengths.sum((1, 2))  # [B]
    width = max(len(p.input_ids) for p in prompts)
    assert packed.input_ids.shape == (3, width + int(branch.max()))
    # answer tokens see only their prompt, their own thought and their own answer (up to themselves)
    row, k, m = 1, 2, 1
    start = width + int(tree.thought_lengths[row, :k].sum() + tree.answer_lengths[row, :k].sum())
    thought_end = start + int(tree.thought_lengths[row, k])
    answer_start = thought_end + int(tree.answer_lengths[row, k, :m].sum())
    query = answer_start + 1
    visible = allowed(packed)[row, query].nonzero().flatten().tolist()
    prompt_cols = list(range(width - len(prompts[row].input_ids), width))
    assert visible == prompt_cols + list(range(start, thought_end)) + [answer_start, query]


def test_flash_attention_is_refused(tiny_model_dir, tmp_path):
    model, adapter = _load(tiny_model_dir, "qwen2_vl", lora=False)
    tree = _ragged_tree(_prompts(adapter, tmp_path), adapter.tokens)
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="4-D attention mask or a FlexAttention block mask"):
        shared_prefix_log_probs(model, tree, [0], adapter.tokens)


def test_gradient_checkpointing_matches_naive(tiny_model_dir, tmp_path):
    """Checkpointed layers drop a KV cache (transformers sets ``cache=None``); the packed pass needs none."""
    model, adapter = _load(tiny_model_dir, "qwen3_vl", lora=False)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    prompts = _prompts(adapter, tmp_path)
    assert_shared_equals_naive(model, _ragged_tree(prompts, adapter.tokens, seed=3), [0, 2], adapter.tokens)


def test_qwen2_5_vl_real_window_size_with_images_spanning_several_windows(tiny_model_dir, tmp_path):
    """Window attention at the released 112-px window (tiny presets use 56 px): 336x224 and 252x392 images
    span 3x2 and 3x4 windows; the packed pass equals the naive one and reproduces the rollout's log-probs."""
    path = tiny_model_dir("qwen2_5_vl", preset="window")
    loaded = load_model(
        ModelConfig(name_or_path=str(path), dtype="float32", min_pixels=3136, max_pixels=392 * 392)
    )
    model, adapter = loaded.model.eval(), loaded.adapter
    assert model.config.vision_config.window_size == 112
    records = []
    for i, (w, h) in enumerate([(336, 224), (252, 392)]):
        image = Image.effect_noise((w, h), 60 + 20 * i).convert("RGB")
        image.save(tmp_path / f"{i}.png")
        records.append(
            Record(
                f"w{i}", str(tmp_path / f"{i}.png"), "detection", "the cup", w, h, Boxes((Box(1, 1, 9, 9),))
            )
        )
    prompts = adapter.build_inputs(records)
    from transformers.vision_utils import get_vision_window_index

    visual = model.model.visual
    for prompt, windows in zip(prompts, (6, 12)):
        _, cu_window_seqlens = get_vision_window_index(
            prompt.image_grid_thw, visual.spatial_merge_size, visual.window_size, visual.patch_size
        )
        assert len(torch.unique_consecutive(torch.as_tensor(cu_window_seqlens))) - 1 == windows
    assert_shared_equals_naive(
        model, _ragged_tree(prompts, adapter.tokens, k=2, m=2, seed=4), [0, 1], adapter.tokens
    )
    params = SamplingParams(
        num_thoughts=2, answers_per_thought=2, max_thought_tokens=5, max_answer_tokens=4, seed=3
    )
    tree = HFRolloutEngine.for_adapter(model, adapter).sample(prompts, params)
    with torch.no_grad():
        shared = shared_prefix_log_probs(model, tree, [0, 1], adapter.tokens)
    torch.testing.assert_close(shared.thought, tree.thought_logprobs * tree.thought_mask, atol=1e-4, rtol=0)
    torch.testing.assert_close(shared.answer, tree.answer_logprobs * tree.answer_mask, atol=1e-4, rtol=0)


# -- FlexAttention (model.attn_implementation: flex_attention) ------------------------------------------------


def test_flex_attention_matches_sdpa_forward(arch, tiny_model_dir, tmp_path):
    """The block-mask pass gives the dense-mask pass's log-probs, every family, ragged tree, padded rows.

    Forward only: torch has no FlexAttention backward on CPU (gradients: tests/gpu). The CPU kernel is torch's
    eager flex_attention (the mask_mod on the dense grid); the block structure is tested below."""
    sdpa, adapter = _load(tiny_model_dir, arch, lora=False)
    flex, _ = _load(tiny_model_dir, arch, lora=False, attn="flex_attention")
    assert flex.config._attn_implementation == BLOCK_MASK_ATTENTION
    tree = _ragged_tree(_prompts(adapter, tmp_path), adapter.tokens, k=3, m=3, seed=6)
    with torch.no_grad():
        dense = shared_prefix_log_probs(sdpa, tree, [2, 0, 1], adapter.tokens)
        blocks = shared_prefix_log_probs(flex, tree, [2, 0, 1], adapter.tokens)
    assert dense.answer.abs().sum() > 0
    torch.testing.assert_close(blocks.thought, dense.thought, atol=1e-5, rtol=0)
    torch.testing.assert_close(blocks.answer, dense.answer, atol=1e-5, rtol=0)


def test_flex_attention_refuses_a_cpu_backward(tiny_model_dir, tmp_path):
    flex, adapter = _load(tiny_model_dir, "qwen2_vl", lora=False, attn="flex_attention")
    tree = _ragged_tree(_prompts(adapter, tmp_path), adapter.tokens)
    with pytest.raises(ValueError, match="flex_attention has no backward on CPU"):
        shared_prefix_log_probs(flex, tree, [0], adapter.tokens)


def test_training_with_flex_attention_on_cpu_is_refused_before_the_model_loads(make_config, tmp_path):
    config = make_config(
        f"model.attn_implementation={FLEX_ATTENTION}", f"logging.output_dir={tmp_path / 'run'}"
    )
    with pytest.raises(
        ConfigError, match=r"^model\.attn_implementation: flex_attention cannot train on CPU \(torch "
    ):
        GRPOMATrainer(config)
    assert not (tmp_path / "run").exists()  # nothing claimed, nothing loaded
    naive = make_config(f"model.attn_implementation={FLEX_ATTENTION}", "train.logprob_pass=naive")
    refuse_flex_training_on_cpu(naive)  # the naive pass trains through SDPA masks: allowed


def test_flex_generation_uses_sdpa_masks(tiny_model_dir, tmp_path):
    """Generation (2-D mask, KV cache) under the flex backend samples what SDPA samples."""
    params = SamplingParams(
        num_thoughts=2, answers_per_thought=2, max_thought_tokens=4, max_answer_tokens=3, seed=2
    )
    trees = []
    for attn in ("sdpa", "flex_attention"):
        model, adapter = _load(tiny_model_dir, "qwen2_5_vl", lora=False, attn=attn)
        trees.append(HFRolloutEngine.for_adapter(model, adapter).sample(_prompts(adapter, tmp_path), params))
    assert torch.equal(trees[0].thought_ids, trees[1].thought_ids)
    assert torch.equal(trees[0].answer_ids, trees[1].answer_ids)


@pytest.mark.parametrize("block", [16, 128])
def test_block_mask_matches_torch_create_block_mask(block, tiny_model_dir, tmp_path):
    """The stripe-by-stripe BlockMask has torch's own block structure (empty / partial / full blocks) and its
    dense expansion is the dense mask, at a block size smaller than the rows (many blocks) and larger."""
    from torch.nn.attention.flex_attention import create_block_mask

    model, adapter = _load(tiny_model_dir, "qwen2_vl", lora=False)
    tree = _ragged_tree(_prompts(adapter, tmp_path), adapter.tokens, k=4, m=3, seed=7)
    packed = pack(model, tree, [0, 1, 2], adapter.tokens)
    n, total = packed.input_ids.shape
    dense = allowed(packed)

    ours = block_mask(packed, torch.device("cpu"), block=block)
    reference = create_block_mask(
        lambda b, h, q, kv: dense[b, q, kv], n, None, total, total, device="cpu", BLOCK_SIZE=block
    )
    assert ours.shape == reference.shape == (n, 1, total, total)
    assert -(-total // block) > (2 if block == 16 else 0)
    for name in ("kv_num_blocks", "full_kv_num_blocks", "q_num_blocks", "full_q_num_blocks"):
        assert torch.equal(getattr(ours, name), getattr(reference, name)), name
    for name, count in (("kv_indices", "kv_num_blocks"), ("full_kv_indices", "full_kv_num_blocks")):
        for row in range(n):
            for qb, c in enumerate(getattr(ours, count)[row, 0].tolist()):
                got = sorted(getattr(ours, name)[row, 0, qb, :c].tolist())
                assert got == sorted(getattr(reference, name)[row, 0, qb, :c].tolist()), (name, row, qb)
    grid = torch.arange(total)
    by_mod = ours.mask_mod(torch.arange(n)[:, None, None], 0, grid[None, :, None], grid[None, None, :])
    assert torch.equal(by_mod, dense)
