"""Merge what scripts/device_check.sh measured into one JSON (``<results>/device_check.json``) and print it:
the environment, the gpu tests' outcomes, and per shape the step's phases, peak memory next to plan's
estimate, and rollout / update tokens per second.

    python scripts/device_report.py RESULTS_DIR [FAILED_STEP ...]
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

GIB = 2**30


def _tests(path: Path) -> dict:
    if not path.is_file():
        return {"error": f"{path.name} not written"}
    cases = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        cases[f"{case.get('classname')}::{case.get('name')}"] = outcome
    return {"counts": {o: list(cases.values()).count(o) for o in set(cases.values())}, "cases": cases}


def _step(path: Path) -> dict:
    if not path.is_file():
        return {"error": f"{path.name} not written"}
    result = json.loads(path.read_text())
    phases = result["steps"][-1]["phases"]
    rollout, update = phases["rollout"], phases["update (log-probs, backward, optimizer)"]
    args = result.get("args", {})
    k, m = args.get("thoughts"), args.get("answers")
    lt, la, prompts = args.get("thought_tokens"), args.get("answer_tokens"), args.get("prompts", 1)
    completion = prompts * (k * lt + k * m * la) if k else None  # every thought and answer at its budget
    return {
        "shape": f"T{k}A{m}",
        "rollout_s": rollout["seconds"],
        "update_s": update["seconds"],
        "rollout_tokens_per_s": completion / rollout["seconds"] if completion else None,
        "update_tokens_per_s": completion / update["seconds"] if completion else None,
        "peak_gib": {"rollout": rollout["peak_bytes"] / GIB, "update": update["peak_bytes"] / GIB},
        "plan_gib": {
            "rollout": result["estimate"]["rollout"][0] / GIB,
            "update": result["estimate"]["update"][0] / GIB,
        },
        "grad_norm": result["steps"][-1]["grad_norm"],
        "raw": result,
    }


def main() -> None:
    results, failed = Path(sys.argv[1]), sys.argv[2:]
    env = results / "env.json"
    report = {
        "env": json.loads(env.read_text()) if env.is_file() else None,
        "gpu_tests": _tests(results / "gpu_tests.xml"),
        "steps": [_step(p) for p in sorted(results.glob("step_T*.json"))],
        "failed": failed,
    }
    (results / "device_check.json").write_text(json.dumps(report, indent=1))
    print(
        json.dumps(
            {k: v for k, v in report.items()}
            | {"steps": [{k: v for k, v in s.items() if k != "raw"} for s in report["steps"]]},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
