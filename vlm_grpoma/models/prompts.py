"""Chat prompts shared by every Qwen-VL family: the think/answer system instruction and per-task instructions.

Families differ only in the coordinate frame they state (``FrameSpec``); releases differ in who opens the
thought (``ThoughtFormat``): "Thinking" chat templates end the generation prompt with ``<think>`` and a
newline, so the model starts inside the thought; the others leave ``<think>`` to the model.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vlm_grpoma.config import DataConfig
from vlm_grpoma.datasets.schema import ANSWER_KIND_OF_TASK, Record
from vlm_grpoma.errors import DataError

SYSTEM_PROMPT = (
    "You are a helpful assistant. First think step by step inside <think> </think>, "
    "then give the final answer as JSON inside <answer> </answer>."
)

#: The same instruction for a prompt that already opened the thought: the model must not open it again.
OPENED_SYSTEM_PROMPT = (
    "You are a helpful assistant. Your reply starts inside an open <think>: think step by step, close the "
    "thought with </think>, then give the final answer as JSON inside <answer> </answer>."
)

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
#: What a prompt that opens the thought appends to the generation prompt (the Qwen3 "Thinking" templates).
OPENED_GENERATION_SUFFIX = THINK_OPEN + "\n"


def opens_thought(generation_prompt: str) -> bool:
    """True when a rendered generation prompt leaves a thought open (ends with ``<think>`` and whitespace).

    A template that closes an empty thought itself (text Qwen3 with ``enable_thinking=False`` renders
    ``<think>\\n\\n</think>\\n\\n``) ends with ``</think>`` and is not open.
    """
    return generation_prompt.rstrip().endswith(THINK_OPEN)


@dataclass(frozen=True)
class ThoughtFormat:
    """Who writes ``<think>``, and therefore what a completion looks like.

    ``opened``: the prompt already opened the thought; the model writes ``thought\\n</think>\\n\\n<answer>…``
    (the layout the Qwen3 Thinking templates render for a past reply). Otherwise the model writes
    ``<think>thought</think><answer>…</answer>`` itself.
    """

    opened: bool

    @property
    def system_prompt(self) -> str:
        return OPENED_SYSTEM_PROMPT if self.opened else SYSTEM_PROMPT

    @property
    def close(self) -> str:
        """The text that ends a thought (appended to a thought cut by its budget); the rollout stops on
        :data:`THINK_CLOSE` in both cases."""
        return "\n" + THINK_CLOSE if self.opened else THINK_CLOSE

    def thought(self, thought: str) -> str:
        """The model's text for a whole thought, up to and including its closing tag."""
        return f"{thought}{self.close}" if self.opened else f"{THINK_OPEN}{thought}{THINK_CLOSE}"

    def completion(self, thought: str, answer: str) -> str:
        """Exactly the text the model should write for ``thought`` and the answer JSON (SFT targets)."""
        between = "\n\n" if self.opened else ""
        return f"{self.thought(thought)}{between}{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"

    def full_text(self, completion: str) -> str:
        """The completion with the ``<think>`` the prompt wrote, so both kinds are checked by one rule."""
        return THINK_OPEN + completion if self.opened else completion


#: The JSON shape the model must write, per answer kind (parsed by ``vlm_grpoma.answers``).
ANSWER_FORMATS: dict[str, str] = {
    "boxes": 'a list of boxes [{"bbox_2d": [x1, y1, x2, y2], "label": "name"}] '
    "with (x1, y1) the top-left and (x2, y2) the bottom-right corner, one box per matching object",
    "points": 'a list of points [{"point_2d": [x, y]}] on the target region',
    "trajectory": "a trajectory [[x, y], [x, y], ...] of at least 2 image points the end effector should follow",
    "contact_action": 'a contact action {"point_2d": [x, y], "up": [ux, uy, uz], "forward": [fx, fy, fz]} '
    "with the contact pixel and the gripper's up and forward unit directions in the camera frame",
    "text": "the final answer alone (a number, a word or a choice letter)",
}

TASK_LEADS: dict[str, str] = {
    "detection": "Find {prompt}.",
    "affordance": "Point to where to act: {prompt}.",
    "trajectory": "Plan the motion: {prompt}.",
    "manipulation": "Manipulate the object: {prompt}.",
    "answer": "Solve: {prompt}.",
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


@dataclass(frozen=True)
class PromptText:
    """The user's own prompt text (``data.prompt_template``, ``data.system_prompt``); empty keeps ours."""

    #: task -> the lead of the user text, a ``str.format`` template over the record's fields
    templates: Mapping[str, str] = field(default_factory=dict)
    #: replaces the think/answer system instruction (full prompt style only)
    system: str = ""


def prompt_text(data: DataConfig) -> PromptText:
    """The :class:`PromptText` a run's ``data`` section asks for (set on the adapter by every command)."""
    return PromptText(dict(data.prompt_template), data.system_prompt)


def record_fields(record: Record) -> dict[str, Any]:
    """What a prompt template may name: the record's fields (``prompt`` stripped) and its ``meta`` keys."""
    fields: dict[str, Any] = {k: v for k, v in record.meta.items() if isinstance(k, str)}
    fields.update(
        prompt=record.prompt.strip(),
        id=record.id,
        task=record.task,
        width=record.width,
        height=record.height,
        split=record.split,
    )
    return fields


def template_names(template: str) -> list[str]:
    """The field names a ``str.format`` template uses (ValueError for a malformed one)."""
    return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]


def render_template(template: str, record: Record) -> str:
    """``template`` filled with :func:`record_fields`; a name the record lacks is a DataError naming both."""
    fields = record_fields(record)
    missing = [name for name in template_names(template) if name not in fields]
    if missing:
        raise DataError(
            f"data.prompt_template.{record.task}: names {{{missing[0]}}}, which record {record.id} does not "
            f"have (its fields: {', '.join(sorted(fields))})"
        )
    return template.format_map(fields)


def task_instruction(
    record: Record,
    frame: FrameSpec,
    model_width: int,
    model_height: int,
    style: str = "full",
    template: str | None = None,
) -> str:
    """The user text for a record: what to do, the JSON shape to answer with, and the coordinate frame.

    With several images (shown as "Picture 1: …", "Picture 2: …" by the chat template's ``add_vision_id``) the
    text names the picture the coordinates are in, and the frame is that picture's.

    A prompt that is already a sentence ("Find the red square.", ending in . ? or !) is used as written; a bare
    referring expression ("the red square") gets the task's lead ("Find the red square."). A ``template``
    (``data.prompt_template.<task>``) replaces that lead; the answer shape and frame still follow it.
    """
    if record.task not in TASK_LEADS:
        raise ValueError(
            f"record {record.id}: unknown task {record.task!r}; expected one of {sorted(TASK_LEADS)}"
        )
    prompt = record.prompt.strip()
    if template:
        lead = render_template(template, record).strip()
    else:
        lead = prompt if prompt.endswith((".", "?", "!")) else TASK_LEADS[record.task].format(prompt=prompt)
    kind = ANSWER_KIND_OF_TASK[record.task]
    if kind == "text":  # no coordinates, so no frame to state
        return (
            f"{lead} Think, then answer."
            if style == "compact"
            else f"{lead} Answer with {ANSWER_FORMATS[kind]}."
        )
    several = record.images or record.video is not None  # the template labels every picture and video
    picture = f"Picture {record.target_image + 1}" if several else ""
    if style == "compact":
        extent = f"{model_width}x{model_height} pixels" if frame.extent is None else f"0-{frame.extent}"
        where = f"{picture}, {extent}" if picture else extent
        return f"{lead} Think, then answer JSON {kind.replace('_', ' ')} ({where})."
    text = f"{lead} Answer with {ANSWER_FORMATS[kind]}. {frame.describe(model_width, model_height)}"
    return f"{text} Coordinates are in {picture}." if picture else text
