"""The comparison's plan and command graph: valid configs for every command, waits that point backwards,
warm-start paths where SFT writes them."""

from __future__ import annotations

import shlex

import pytest
from comparison.graph import Layout, build_jobs
from comparison.jobs import REPO
from comparison.plan import Arm, ComparePlan

from vlm_grpoma.cli import build_parser
from vlm_grpoma.config import load_config, validate
from vlm_grpoma.trainer.sft import SFTTrainer


def test_arm_names_round_trip_and_bad_names_say_the_form():
    assert Arm.parse("T4A4") == Arm(4, 4) and Arm(16, 1).name == "T16A1" and Arm(8, 2).samples == 16
    for bad in ("T1A4", "T4A0", "4x4", "t4a4"):
        with pytest.raises(ValueError, match="write T<K>A<M>"):
            Arm.parse(bad)


def test_noisy_arms_name_their_flip_and_set_the_reward_noise():
    arm = Arm.parse("T4A4-flip0.2")
    assert arm == Arm(4, 4, flip=0.2) and arm.name == "T4A4-flip0.2" and arm.base == "T4A4"
    assert "rewards.noise.flip=0.2" in arm.overrides() and Arm(16, 1).overrides()[-1].startswith("rollout.")
    for bad in ("T4A4-flip0.7", "T4A4-flip", "T4A4-flip-0.1"):
        with pytest.raises(ValueError, match="-flip<p>"):
            Arm.parse(bad)
    plan = ComparePlan.named("crossover")
    assert [a.name for a in plan.arms] == [
        "T16A1",
        "T4A4",
        "T16A1-flip0.2",
        "T4A4-flip0.2",
        "T16A1-flip0.4",
        "T4A4-flip0.4",
    ]
    assert (
        plan.seeds == (0, 1, 2, 3, 4) and plan.time_budget_s == 150 and {a.samples for a in plan.arms} == {16}
    )


def test_full_plan_is_the_issue_grid_and_arms_compare_at_equal_samples():
    plan = ComparePlan.full()
    assert [t.name for t in plan.tasks] == ["detection", "manipulation"]
    assert [a.name for a in plan.arms] == ["T4A1", "T16A1", "T4A4", "T8A2"] and plan.seeds == (0, 1, 2)
    assert {a.samples for a in plan.arms if a.name != "T4A1"} == {16}
    with pytest.raises(
        ValueError, match=r"--tasks: unknown task 'grasping'; this plan has detection, manipulation"
    ):
        plan.select(tasks=["grasping"])
    small = plan.select(tasks=["manipulation"], arms=["T4A4"], seeds=[2])
    assert (
        [t.name for t in small.tasks] == ["manipulation"]
        and small.arms == (Arm(4, 4),)
        and small.seeds == (2,)
    )
    assert small.name == "full-subset" and small.arguments == " --tasks manipulation --arms T4A4 --seeds 2"
    assert plan.select() is plan and ComparePlan.quick().select(seeds=[1]).arguments == " --quick --seeds 1"


def test_paper_regime_plans_train_every_arm_for_equal_time():
    plan = ComparePlan.named("paper-regime")
    assert plan is not None and plan.name == "paper-regime" and plan.arguments == " --plan paper-regime"
    assert [a.name for a in plan.arms] == ["T4A1", "T16A1", "T4A4", "T8A2"] and plan.seeds == (0, 1, 2)
    [task] = plan.tasks
    assert (task.name, task.data_task, task.difficulty, task.headline) == (
        "relational",
        "detection",
        "relational",
        "iou",
    )
    assert plan.equal_time and not ComparePlan.named("toy").equal_time
    quick = ComparePlan.named("paper-regime", quick=True)
    assert quick.equal_time and quick.arguments == " --plan paper-regime --quick" and quick.arms == plan.arms
    assert ComparePlan.named("toy", quick=True).name == "quick"
    with pytest.raises(ValueError, match="--plan: unknown plan 'paper'; choose toy, paper-regime, reasoning"):
        ComparePlan.named("paper")


def test_reasoning_plans_train_text_only_arithmetic_for_equal_time(tmp_path):
    plan = ComparePlan.named("reasoning")
    assert plan.name == "reasoning" and plan.arguments == " --plan reasoning" and plan.equal_time
    assert [a.name for a in plan.arms] == ["T4A1", "T16A1", "T4A4", "T8A2", "T4A4-adaptive"]
    assert plan.seeds == (0, 1, 2)
    [task] = plan.tasks
    assert (task.data_task, task.source, task.difficulty, task.headline_label) == (
        "answer",
        "arithmetic",
        "easy",
        "accuracy",
    )
    jobs = {j.name: j for j in build_jobs(plan, Layout(tmp_path))}
    data = jobs["data/arithmetic/train"].args
    assert data[data.index("--task") + 1] == "answer" and data[data.index("--source") + 1] == "arithmetic"
    assert data[data.index("--difficulty") + 1] == "easy"
    quick = ComparePlan.named("reasoning", quick=True)
    assert quick.equal_time and quick.arguments == " --plan reasoning --quick" and quick.title == plan.title
    assert [a.name for a in quick.arms] == ["T4A1", "T16A1", "T4A4", "T8A2"]  # the smoke test skips H5's arm
    adaptive = jobs["train/arithmetic/T4A4-adaptive/seed0"].args
    assert "rollout.adaptive_answers.enabled=true" in adaptive


PLANS = [
    ComparePlan.full(),
    ComparePlan.quick(),
    ComparePlan.paper_regime(),
    ComparePlan.paper_regime_quick(),
    ComparePlan.reasoning(),
    ComparePlan.reasoning_quick(),
    ComparePlan.crossover(),
    ComparePlan.crossover_quick(),
]


@pytest.mark.parametrize("plan", PLANS, ids=[p.name for p in PLANS])
def test_every_command_is_valid_and_waits_only_for_earlier_jobs(plan, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    layout = Layout(tmp_path / "runs")
    jobs = build_jobs(plan, layout)
    assert len({j.name for j in jobs}) == len(jobs)
    assert len([j for j in jobs if j.name.startswith("train/")]) == len(plan.tasks) * len(plan.arms) * len(
        plan.seeds
    )
    earlier: set[str] = set()
    for job in jobs:
        assert set(job.after) <= earlier, job.name
        earlier.add(job.name)
        command = shlex.split(job.command())
        program = ["python", job.script] if job.script else ["vlm-grpoma"]
        # paths relative to the checkout
        assert command[: len(program)] == program and str(tmp_path) not in job.command()
        assert command[len(program) :] == [a.replace(f"{tmp_path}/", "") for a in job.args]
        if not job.script:
            build_parser().parse_args(list(job.args))  # the CLI accepts it (argparse exits on a bad flag)
        if job.args[0] in ("sft", "train"):
            config = load_config(job.args[2], job.args[3:])
            validate(config)
            assert config.logging.output_dir == str(job.out)
    trains = [j for j in jobs if j.name.startswith("train/")]
    for task in plan.tasks:
        task_jobs = [j for j in trains if j.name.startswith(f"train/{task.name}/")]
        configs = [load_config(j.args[2], j.args[3:]) for j in task_jobs]
        # arms of a task differ only in K, M, seed and output folder
        shared = {
            (
                c.model.name_or_path,
                c.data.train_path,
                tuple(c.data.eval_sets.items()),
                c.train.steps,
                c.train.time_budget_s,
                c.optim.learning_rate,
                c.train.eval_every,
            )
            for c in configs
        }
        assert len(shared) == 1
        assert configs[0].train.time_budget_s == plan.time_budget_s
        assert configs[0].model.name_or_path == str(layout.warm_start(task))
        assert sorted(configs[0].data.eval_sets) == sorted(task.eval_records)


def test_relational_tasks_check_that_the_warm_start_follows_its_thought(tmp_path):
    plan = ComparePlan.paper_regime()
    layout = Layout(tmp_path)
    jobs = {j.name: j for j in build_jobs(plan, layout)}
    check = jobs["thought-matters/relational"]
    assert check.script == "benchmarks/thought_matters.py" and (REPO / check.script).is_file()
    assert check.args[:2] == (
        str(layout.warm_start(plan.tasks[0])),
        str(layout.records(plan.tasks[0], "test")),
    )
    assert set(check.after) == {"sft/relational", "data/relational/test"}
    assert not any(
        name.startswith("thought-matters/")
        for name in (j.name for j in build_jobs(ComparePlan.full(), layout))
    )


def test_warm_start_path_is_where_sft_leaves_its_final_model(tmp_path):
    plan = ComparePlan.quick()
    task = plan.tasks[0]
    layout = Layout(tmp_path)
    sft = next(j for j in build_jobs(plan, layout) if j.name == f"sft/{task.name}")
    config = load_config(sft.args[2], sft.args[3:])
    # final_model_dir (Trainer's) needs only the config and the step count
    run = SFTTrainer.__new__(SFTTrainer)
    run.config, run.step = config, config.train.steps
    assert run.final_model_dir == layout.warm_start(task)


def test_the_adaptive_arm_spends_the_same_budget_per_prompt():
    from comparison.plan import Arm

    arm = Arm.parse("T4A4-adaptive")
    assert arm.name == "T4A4-adaptive" and arm.samples == Arm.parse("T4A4").samples == 16
    assert arm.overrides()[2:] == (
        "rollout.adaptive_answers.enabled=true",
        "rollout.adaptive_answers.first=2",
        "rollout.adaptive_answers.budget=16",
        "rollout.adaptive_answers.min_per_thought=2",
        "rollout.adaptive_answers.max_per_thought=8",
    )
    with pytest.raises(ValueError, match="T<K>A<M>-adaptive with M >= 2"):
        Arm.parse("T4A1-adaptive")


def test_steps_and_page_options_shorten_every_arm_alike_and_name_the_report():
    from comparison.report import report_names

    plan = ComparePlan.full().select(tasks=["manipulation"]).with_steps(40).with_page("results-x.md")
    assert [t.steps for t in plan.tasks] == [40]
    assert plan.arguments == " --tasks manipulation --steps 40 --page results-x.md"
    assert ComparePlan.full().with_steps(None).tasks[1].steps == 60
    assert report_names(plan, "results-x.md") == ("results-x.md", "compare-x")
    assert report_names(ComparePlan.full()) == ("results.md", "compare")
    with pytest.raises(ValueError, match="--steps"):
        ComparePlan.full().with_steps(0)
    with pytest.raises(ValueError, match="--page"):
        report_names(plan, "docs/results.md")


def test_sft_steps_option_sets_every_tasks_warm_start_and_names_the_report():
    quick = ComparePlan.paper_regime_quick()
    plan = quick.with_sft_steps(4)
    assert [t.sft_steps for t in plan.tasks] == [4] and [t.sft_steps for t in quick.tasks] == [20]
    assert plan.name == "paper-regime-quick-subset" and plan.arguments.endswith(" --sft-steps 4")
    assert quick.with_sft_steps(None) is quick
    with pytest.raises(ValueError, match=r"^--sft-steps: 0 SFT steps; give at least 1$"):
        quick.with_sft_steps(0)


def test_time_budget_option_sets_every_arms_seconds_and_names_the_report():
    quick = ComparePlan.reasoning_quick()
    plan = quick.with_time_budget(4)
    assert plan.time_budget_s == 4 and quick.time_budget_s == 15 and plan.tasks == quick.tasks
    assert (
        plan.name == "reasoning-quick-subset"
        and plan.arguments == " --plan reasoning --quick --time-budget 4"
    )
    assert quick.with_time_budget(None) is quick
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=r"^--time-budget: .* give a finite number of seconds > 0$"):
            quick.with_time_budget(bad)
    with pytest.raises(
        ValueError, match=r"^--time-budget: plan 'full' compares at equal steps; use --steps$"
    ):
        ComparePlan.full().with_time_budget(4)
