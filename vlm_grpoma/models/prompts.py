"""Chat prompts shared by every Qwen-VL family: the think/answer system instruction and per-task instructions.

Families differ only in the coordinate frame they state (``FrameSpec``); everything else is one text.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlm_grpoma.datasets.schema import ANSWER_KIND_OF_TASK, Record

SYSTEM_PROMPT = (
    "You are a helpful assistant. First think step by step inside <think> </think>, "
    "then give the final answer as JSON inside <answer> </answer>."
)

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

#: The JSON shape the model must write, per answer kind (parsed by ``vlm_grpoma.answers``).
ANSWER_FORMATS: dict[str, str] = {
    "boxes": 'a list of boxes [{"bbox_2d": [x1, y1, x2, y2], "label": "name"}] '
    "with (x1, y1) the top-left and (x2, y2) the bottom-right corner, one box per matching object",
    "points": 'a list of points [{"point_2d": [x, y]}] on the target region',
    "trajectory": "a trajectory [[x, y], [x, y], ...] of at least 2 image points the end effector should follow",
    "contact_action": 'a contact action {"point_2d": [x, y], "up": [ux, uy, uz], "forward": [fx, fy, fz]} '
    "with the contact pixel and the gripper's up and forward unit directions in the camera frame",
}

TASK_LEADS: dict[str, str] = {
    "detection": "Find {prompt}.",
    "affordance": "Point to where to act: {prompt}.",
    "trajectory": "Plan the motion: {prompt}.",
    "manipulation": "Manipulate the object: {prompt}.",
}


@dataclass(frozen=True)
class FrameSpec:
    """How a family states its coordinate frame to the model; ``extent`` None means resized-image pixels."""

    extent: int | None

    def describe(self, model_width: int, model_height: int) -> str:
        if self.extent is None:
            return (
                f"Coordinates are integer pixels of the image as you see it ({model_width}x{model_height}), "
                "x to the right and y down from the top-left corner."
            )
        return (
            f"Coordinates are integers from 0 to {self.extent} relative to the image width and height, "
            f"x to the right and y down from the top-left corner (0 = left/top edge, {self.extent} = right/bottom edge)."
        )


def task_instruction(
    record: Record, frame: FrameSpec, model_width: int, model_height: int, style: str = "full"
) -> str:
    """The user text for a record: what to do, the JSON shape to answer with, and the coordinate frame.

    A prompt that is already a sentence ("Find the red square.", ending in . ? or !) is used as written; a bare
    referring expression ("the red square") gets the task's lead ("Find the red square.").
    """
    if record.task not in TASK_LEADS:
        raise ValueError(
            f"record {record.id}: unknown task {record.task!r}; expected one of {sorted(TASK_LEADS)}"
        )
    prompt = record.prompt.strip()
    lead = prompt if prompt.endswith((".", "?", "!")) else TASK_LEADS[record.task].format(prompt=prompt)
    kind = ANSWER_KIND_OF_TASK[record.task]
    if style == "compact":
        extent = f"{model_width}x{model_height} pixels" if frame.extent is None else f"0-{frame.extent}"
        return f"{lead} Think, then answer JSON {kind.replace('_', ' ')} ({extent})."
    return f"{lead} Answer with {ANSWER_FORMATS[kind]}. {frame.describe(model_width, model_height)}"
