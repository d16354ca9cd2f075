"""`vlm-grpoma train rollout.backend=vllm` with the real vLLM engine (CPU build in .venv-vllm): one process (LoRA,
weights merged into vLLM), and 2 CPU ranks under launch/train.sh (ZeRO-3, weights gathered). The command runs
through ``length_reward.py`` (the CLI with a reward random models vary on registered), so steps change weights.

After every optimizer step the trainer copies the new weights into vLLM; the next step's rollout log-probs
must then match the trainer's teacher-forced log-probs of the same tokens. ``rollout/logp_mismatch_max`` is
that gap, logged every step: both sides run float32 on CPU, so it stays below 1e-4 (measured <= 1e-6); with
the weight copy left out it is 0.13-0.8 from the second step on (checked by hand), so the bound tests the
copy. LoRA dropout is off: dropout in the training forward would itself make the two differ (~5e-3).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.rollout.server_process import ServerProcess, start_server
from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes
from vlm_grpoma.run_layout import TRAINER_STATE_FILE
from vlm_grpoma.trainer.sampler import PromptSampler

REPO = Path(__file__).resolve().parents[2]
TRAIN = Path(__file__).with_name("length_reward.py")
BOUND = 1e-4
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed in this environment (`make test-vllm` runs these tests in .venv-vllm)",
    ),
]


def run_config(tmp_path: Path, model: Path, prompts_per_step: int, *extra: str) -> Path:
    data = generate_shapes("detection", 8, tmp_path / "data", seed=0, config=EASY)
    config = tmp_path / "run.yaml"
    config.write_text(
        "\n".join(
            [
                f"model: {{name_or_path: {model}, dtype: float32, prompt_style: compact, max_pixels: 12544}}",
                f"data: {{train_path: {data}}}",
                "rollout: {backend: vllm, num_thoughts: 2, answers_per_thought: 2, max_thought_tokens: 8, "
                "max_answer_tokens: 8, vllm: {enforce_eager: true, kv_cache_gib: 0.25, max_model_len: 1024}}",
                "algorithm: {kl_beta: 0.0}",
                "rewards: {weights: {test_answer_length: 1.0}}",
                "optim: {learning_rate: 1e-3}",
                f"train: {{steps: 3, prompts_per_step: {prompts_per_step}, micro_batch_prompts: 1}}",
                f"logging: {{progress_bar: false, output_dir: {tmp_path / 'run'}}}",
                *extra,
            ]
        )
        + "\n"
    )
    return config


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without the pytest process's own rendezvous variables."""
    drop = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "OMP_NUM_THREADS": "1", **extra}


def train(config: Path, *overrides: str) -> subprocess.CompletedProcess:
    """``vlm-grpoma train`` (through ``TRAIN``) in one fresh process with a clean environment."""
    return subprocess.run(
        [sys.executable, str(TRAIN), "--config", str(config), *overrides],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )


def check_run(run: subprocess.CompletedProcess, output: Path) -> list[dict]:
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["train/skipped_steps"] == 0 for r in rows)
    mismatch = [r["rollout/logp_mismatch_max"] for r in rows]
    assert all(0 <= m < BOUND for m in mismatch), mismatch
    # the policy is trained (a gradient every step), so a stale engine would show; not `loss/total != 0`: on
    # policy with kl_beta 0 the loss is the mean of normalised advantages, zero up to rounding (~1e-8)
    assert all(r["train/grad_norm"] > 0 and r["adv/answer_abs_mean"] > 0 for r in rows)
    assert (output / "checkpoints" / "step-00000003" / "model").is_dir()
    return rows


def test_train_with_vllm_in_one_process_with_lora(tiny_model_dir, tmp_path):
    config = run_config(tmp_path, tiny_model_dir("qwen2_5_vl", "small"), 2, "deepspeed: {zero_stage: 0}")
    run = subprocess.run(
        [
            sys.executable,
            str(TRAIN),
            "--config",
            str(config),
            "model.lora.enabled=true",
            "model.lora.dropout=0",
        ],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    check_run(run, tmp_path / "run")


def test_train_with_vllm_on_records_with_two_images_and_a_video(tiny_model_dir, tmp_path):
    """Every record shows a video (3 frames), a second view and its own image: vLLM samples them as the trainer
    scores them (log-prob gap below the bound every step), on Qwen2.5-VL, whose video time axis is the one
    transformers and vLLM disagree on (models/positions.py)."""
    from dataclasses import replace

    from PIL import Image

    from vlm_grpoma.datasets.jsonl import read_records, write_records
    from vlm_grpoma.datasets.schema import Video, with_images

    config = run_config(tmp_path, tiny_model_dir("qwen2_5_vl", "small"), 2, "deepspeed: {zero_stage: 0}")
    records = read_records(tmp_path / "data" / "records.jsonl")
    frames = []
    for i in range(3):
        frames.append(str(tmp_path / "data" / f"frame{i}.png"))
        Image.new("RGB", (64, 48), (40 * i, 90, 160)).save(frames[-1])
    Image.new("RGB", (72, 56), (200, 40, 40)).save(tmp_path / "data" / "view.png")
    shown = [
        replace(with_images(r, (str(tmp_path / "data" / "view.png"), r.image), 1), video=Video(tuple(frames)))
        for r in records
    ]
    write_records(tmp_path / "data" / "records.jsonl", shown)
    check_run(train(config, "model.max_images=2", "model.max_video_frames=4"), tmp_path / "run")


@pytest.mark.launcher
def test_train_with_vllm_on_two_cpu_ranks_under_the_launcher_with_zero3(tiny_model_dir, tmp_path):
    config = run_config(tmp_path, tiny_model_dir("qwen3_vl", "small"), 4, "deepspeed: {zero_stage: 3}")
    deepspeed = Path(sys.executable).parent / "deepspeed"  # this environment's launcher and Python
    run = subprocess.run(
        ["bash", str(REPO / "launch" / "train.sh"), str(config)],
        env=clean_env(CPU_RANKS="2", DEEPSPEED=str(deepspeed), TRAIN_SCRIPT=str(TRAIN)),
        capture_output=True,
        text=True,
        timeout=900,
    )
    check_run(run, tmp_path / "run")
    meta = json.loads((tmp_path / "run" / "checkpoints" / "step-00000003" / "checkpoint.json").read_text())
    assert meta["world_size"] == 2 and meta["zero_stage"] == 3


def test_train_with_vllm_at_t07_corrects_the_rollout_mismatch(tiny_model_dir, tmp_path):
    """At T = 0.7 vLLM records its processed log-probs (banned vision/end tokens out of the softmax), so they
    differ from the trainer's tempered ones; the default rollout correction (TIS, token, cap 2) then weighs the
    tokens by ratios that differ from 1 exactly where the logged mismatch is non-zero, with GSPO's sequence
    ratio, the entropy mask and dynamic sampling on."""
    config = run_config(tmp_path, tiny_model_dir("qwen2_5_vl", "small"), 2, "deepspeed: {zero_stage: 0}")
    run = train(
        config,
        "rollout.temperature=0.7",
        "algorithm.importance_sampling_level=sequence",
        "algorithm.top_entropy_fraction=0.5",
        "algorithm.dynamic_sampling.enabled=true",
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert row["train/skipped_steps"] == 0
        mismatch, ratio_max = row["rollout/logp_mismatch_max"], row["rollout_correction/ratio_max"]
        assert (mismatch > 0) == (ratio_max != 1.0), row
        assert abs(row["rollout_correction/ratio_mean"] - 1) < 0.1, (
            row
        )  # a slight mismatch, not another policy
        assert 0.3 < row["entropy/masked_fraction"] < 0.7
    assert any(r["rollout/logp_mismatch_max"] > 0 for r in rows)


def test_train_with_vllm_and_adaptive_answers(tiny_model_dir, tmp_path):
    """rollout.adaptive_answers with the vLLM backend: each step's extra answers come from vLLM after the
    first ones were scored, within the budget and bounds, with the trainer's log-probs after every weight sync."""
    config = run_config(tmp_path, tiny_model_dir("qwen2_5_vl", "small"), 2, "deepspeed: {zero_stage: 0}")
    run = subprocess.run(
        [
            sys.executable,
            str(TRAIN),
            "--config",
            str(config),
            "rollout.adaptive_answers.enabled=true",
            "rollout.adaptive_answers.first=2",
            "rollout.adaptive_answers.budget=6",
            "rollout.adaptive_answers.max_per_thought=4",
        ],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    rows = check_run(run, tmp_path / "run")
    for row in rows:
        assert row["answers/per_thought_mean"] == 3.0
        assert 2 <= row["answers/per_thought_min"] <= row["answers/per_thought_max"] <= 4
        assert row["reward/non_finite"] == 0


@dataclass
class Served:
    """Rollout servers started for one test, each on the small checkpoint of a family."""

    tiny_model_dir: Any
    folder: Path
    servers: list[ServerProcess] = field(default_factory=list)

    def start(self, arch: str) -> tuple[Path, list[str]]:
        """A server on ``arch``: its checkpoint and the overrides that train through it."""
        model = self.tiny_model_dir(arch, "small")
        log = self.folder / f"server-{len(self.servers)}.log"
        self.servers.append(start_server(model, log, "model.max_pixels=12544"))
        return model, ["rollout.backend=vllm_server", f'rollout.server.urls=["{self.servers[-1].url}"]']


@pytest.fixture
def served(tiny_model_dir, tmp_path):
    serving = Served(tiny_model_dir, tmp_path)
    yield serving
    for server in serving.servers:
        server.stop()


def test_train_through_a_rollout_server_in_one_process(served, tmp_path):
    """The weights pushed after every step are the ones sampled with: the next rollout's log-probs are the
    trainer's (the same bound as colocated vLLM), on a server in another process."""
    model, overrides = served.start("qwen2_5_vl")
    config = run_config(tmp_path, model, 2, "deepspeed: {zero_stage: 0}")
    run = subprocess.run(
        [sys.executable, str(TRAIN), "--config", str(config), *overrides],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    check_run(run, tmp_path / "run")


@pytest.mark.launcher
def test_train_through_a_rollout_server_on_two_cpu_ranks_with_zero3(served, tmp_path):
    """Two ranks share one server: rank 0 gathers (ZeRO-3) and pushes, rank 1 waits for each version."""
    model, overrides = served.start("qwen3_vl")
    config = run_config(tmp_path, model, 4, "deepspeed: {zero_stage: 3}")
    deepspeed = Path(sys.executable).parent / "deepspeed"
    run = subprocess.run(
        ["bash", str(REPO / "launch" / "train.sh"), str(config), *overrides],
        env=clean_env(CPU_RANKS="2", DEEPSPEED=str(deepspeed), TRAIN_SCRIPT=str(TRAIN)),
        capture_output=True,
        text=True,
        timeout=900,
    )
    check_run(run, tmp_path / "run")


def interrupted_training(
    served, tmp_path: Path, extra: list[str], logged_steps: int, interrupt: Callable[[subprocess.Popen], Any]
) -> tuple[int, str, float]:
    """Train through a fresh server (with ``extra`` overrides) until ``logged_steps`` steps are logged, then
    ``interrupt(trainer)``: the exit code, stderr, and seconds from the interrupt to the exit."""
    model, overrides = served.start("qwen2_5_vl")
    config = run_config(tmp_path, model, 2, "deepspeed: {zero_stage: 0}")
    metrics = tmp_path / "run" / "metrics.jsonl"
    trainer = subprocess.Popen(
        [sys.executable, str(TRAIN), "--config", str(config), *overrides, "train.steps=500", *extra],
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 600
        while len(metrics.read_text().splitlines() if metrics.exists() else []) < logged_steps:
            assert trainer.poll() is None and time.monotonic() < deadline, trainer.communicate()
            time.sleep(0.2)
        interrupt(trainer)
        interrupted = time.monotonic()
        _, stderr = trainer.communicate(timeout=120)
    finally:
        if trainer.poll() is None:
            trainer.kill()
    return trainer.returncode, stderr, time.monotonic() - interrupted


@pytest.mark.parametrize("overlap", ["sync", "async"])
def test_a_server_killed_mid_run_stops_training_with_one_line(served, tmp_path, overlap):
    """Synchronous or one step off (the kill then lands during a prefetch, raised where the step takes it)."""
    extra = ["rollout.server.timeout_s=20"] + (
        ["train.async_rollout.enabled=true"] if overlap == "async" else []
    )
    code, stderr, seconds = interrupted_training(
        served, tmp_path, extra, 1, lambda _: served.servers[0].stop()
    )
    assert code == 1 and seconds < 60
    errors = [line for line in stderr.splitlines() if line.startswith("vlm-grpoma train: error:")]
    assert len(errors) == 1 and f"rollout server {served.servers[0].url}" in errors[0], stderr[-3000:]


def test_sigterm_during_an_overlapped_rollout_saves_and_exits_75_without_waiting_for_it(served, tmp_path):
    """The prefetch of the next step is in flight on a daemon thread; SIGTERM finishes the step, saves and
    exits 75 without taking the rollout it will not train on (the resumed run draws those prompts again)."""
    import signal

    extra = ["train.async_rollout.enabled=true", "checkpoint.save_every=0"]
    code, stderr, seconds = interrupted_training(
        served, tmp_path, extra, 2, lambda trainer: trainer.send_signal(signal.SIGTERM)
    )
    assert code == 75 and seconds < 60, stderr[-3000:]
    run = tmp_path / "run"
    saved = [int(path.name.removeprefix("step-")) for path in (run / "checkpoints").glob("step-*")]
    assert saved == [len((run / "metrics.jsonl").read_text().splitlines())], (saved, stderr[-2000:])


def trained_record_ids(output: Path) -> dict[int, list[str]]:
    """step -> the record of each prompt rank 0 trained on, in order (from samples.jsonl, every answer logged)."""
    by_step: dict[int, list[str]] = {}
    for line in (output / "samples.jsonl").read_text().splitlines():
        sample = json.loads(line)
        ids = by_step.setdefault(sample["step"], [])
        if not ids or ids[-1] != sample["record"]:
            ids.append(sample["record"])
    return by_step


def synchronous_order(
    data: Path, prompts_per_step: int, steps: int
) -> tuple[dict[int, list[str]], PromptSampler]:
    """The records a synchronous run trains on per step, and its sampler after ``steps`` steps."""
    ids = [json.loads(line)["id"] for line in data.read_text().splitlines()]
    sampler = PromptSampler(len(ids), prompts_per_step, seed=0)
    order = {step: [ids[i] for i in sampler.next_step()] for step in range(1, steps + 1)}
    return order, sampler


def async_run(served, tmp_path: Path, *extra: str) -> tuple[list[dict], Path]:
    model, overrides = served.start("qwen2_5_vl")
    config = run_config(tmp_path, model, 2, "deepspeed: {zero_stage: 0}")
    run = train(
        config,
        *overrides,
        "train.async_rollout.enabled=true",
        "train.steps=4",
        "checkpoint.save_every=2",
        "logging.samples=8",  # every answer of both prompts: the trained records
        "logging.samples_every=1",
        *extra,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    return rows, tmp_path / "run"


def test_async_training_through_a_rollout_server_samples_one_step_off(served, tmp_path):
    """train.async_rollout: step t+1 is sampled while step t trains, so from step 2 on its tokens come from the
    weights one push old; the logged mismatch then exceeds the fresh-weights bound (the staleness is real, and
    TIS weighs it), the prompts are the synchronous run's in its order, and the checkpoint taken while step 3's
    rollout was in flight saves the data position before its prompts (a resume draws them again)."""
    rows, output = async_run(served, tmp_path)
    assert [r["async/staleness"] for r in rows] == [0, 1, 1, 1]
    assert [r["async/dropped"] for r in rows] == [0, 0, 0, 0]
    assert rows[0]["async/overlap_s"] == 0 and all(r["async/overlap_s"] > 0 for r in rows[1:])
    assert all(r["async/wait_s"] >= 0 and r["train/skipped_steps"] == 0 for r in rows)
    assert rows[0]["rollout/logp_mismatch_max"] < BOUND  # step 1 is sampled synchronously
    assert all(r["rollout/logp_mismatch_max"] > BOUND for r in rows[1:]), rows
    assert all(r["rollout_correction/ratio_max"] != 1.0 for r in rows[1:])
    order, _ = synchronous_order(tmp_path / "data" / "records.jsonl", 2, 4)
    assert trained_record_ids(output) == order
    _, after_two = synchronous_order(tmp_path / "data" / "records.jsonl", 2, 2)
    state = torch.load(output / "checkpoints" / "step-00000002" / TRAINER_STATE_FILE, weights_only=True)
    assert state["data"] == after_two.state_dict()


def test_max_staleness_zero_is_the_synchronous_loop_exactly(served, tmp_path):
    """train.async_rollout with max_staleness=0 prefetches nothing: every step's losses and rewards equal the
    run with async off (same server, seeds and data)."""
    runs = {}
    for name, extra in (("sync", ()), ("zero", ("train.async_rollout.max_staleness=0",))):
        model, overrides = served.start("qwen2_5_vl")
        config = run_config(tmp_path / name, model, 2, "deepspeed: {zero_stage: 0}")
        enabled = "train.async_rollout.enabled=true" if extra else "train.async_rollout.enabled=false"
        run = train(config, *overrides, enabled, *extra, "train.steps=3")
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        runs[name] = [
            json.loads(line) for line in (tmp_path / name / "run" / "metrics.jsonl").read_text().splitlines()
        ]
    for key in ("loss/total", "loss/policy", "reward/total_mean", "train/grad_norm"):
        assert [r[key] for r in runs["zero"]] == [r[key] for r in runs["sync"]], key
    assert not any(key.startswith("async/") for key in runs["zero"][0])


def test_async_rollouts_staler_than_max_staleness_are_sampled_again(served, tmp_path):
    """With two policy epochs a one-step-off rollout lags by two versions: max_staleness=1 drops it and samples
    the same prompts with the current weights (then the mismatch is back under the fresh-weights bound)."""
    rows, output = async_run(
        served, tmp_path, "algorithm.policy_epochs=2", "train.async_rollout.max_staleness=1"
    )
    assert [r["async/staleness"] for r in rows] == [0, 2, 2, 2]
    assert [r["async/dropped"] for r in rows] == [0, 1, 1, 1]
    assert all(r["rollout/logp_mismatch_max"] < BOUND for r in rows), rows
    order, _ = synchronous_order(tmp_path / "data" / "records.jsonl", 2, 4)
    assert trained_record_ids(output) == order


def serve_and_train_env(tmp_path: Path, port: int, ranks: int) -> dict[str, str]:
    """launch/train.sh's environment for one CPU rollout server (logs in tmp_path/servers) and ``ranks`` CPU
    trainer ranks running this test's training script."""
    return clean_env(
        CPU_RANKS=str(ranks),
        ROLLOUT_SERVERS="1",
        ROLLOUT_PORT=str(port),
        ROLLOUT_LOG_DIR=str(tmp_path / "servers"),
        DEEPSPEED=str(Path(sys.executable).parent / "deepspeed"),
        TRAIN_SCRIPT=str(TRAIN),
    )


@pytest.mark.launcher
def test_train_sh_serve_and_train_layout_trains_two_ranks_async_through_its_server(tiny_model_dir, tmp_path):
    """ROLLOUT_SERVERS=1 CPU_RANKS=2: launch/train.sh starts one rollout server with the run's config, waits
    for it, trains two ZeRO-3 ranks through it one step off (rank 0 gathers and pushes), and stops it."""
    from vlm_grpoma.distributed import free_port

    port = free_port()
    config = run_config(tmp_path, tiny_model_dir("qwen3_vl", "small"), 4, "deepspeed: {zero_stage: 3}")
    run = subprocess.run(
        ["bash", str(REPO / "launch" / "train.sh"), str(config), "train.async_rollout.enabled=true"],
        env=serve_and_train_env(tmp_path, port, ranks=2),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "1 rollout server(s) ready" in run.stdout
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["async/staleness"] for r in rows] == [0, 1, 1]
    assert all(r["train/grad_norm"] > 0 and r["train/skipped_steps"] == 0 for r in rows)
    assert rows[0]["rollout/logp_mismatch_max"] < BOUND
    assert "listening on http://127.0.0.1:" in (tmp_path / "servers" / "server-0.log").read_text()
    with pytest.raises(OSError):  # stopped with the training
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
            f"http://127.0.0.1:{port}/health", timeout=5
        )


@pytest.mark.launcher
def test_a_serve_and_train_launcher_killed_with_sigkill_leaves_no_server(tiny_model_dir, tmp_path):
    """kill -9 of launch/train.sh runs none of its clean-up: its server, started with --stop-with, notices
    that the launcher is gone and stops itself (the orphaned ranks are the test's to end)."""
    import signal

    from vlm_grpoma.distributed import free_port

    port = free_port()
    config = run_config(tmp_path, tiny_model_dir("qwen2_5_vl", "small"), 1)
    launcher = subprocess.Popen(
        ["bash", str(REPO / "launch" / "train.sh"), str(config), "train.steps=100000"],
        env=serve_and_train_env(tmp_path, port, ranks=1),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    health = f"http://127.0.0.1:{port}/health"
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        output = []
        for line in launcher.stdout:
            output.append(line)
            if "rollout server(s) ready" in line:
                break
        assert direct.open(health, timeout=10).status == 200, "".join(output)
        os.kill(launcher.pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                direct.open(health, timeout=5)
                time.sleep(0.5)
            except OSError:
                break
        else:
            pytest.fail("the server still answers 60 s after its launcher was killed")
        assert "(--stop-with) ended; stopping" in (tmp_path / "servers" / "server-0.log").read_text()
    finally:
        os.killpg(launcher.pid, signal.SIGKILL)  # the launcher's orphaned ranks
        launcher.wait(timeout=30)
