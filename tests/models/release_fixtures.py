"""Fixture tokenizers and processors that reproduce the chat format and vocabulary of each Qwen-VL release.

The Hugging Face hub is not reachable from the test machines, so each release's published format was looked
up in public repositories and is reproduced here; the tests compare our renderings with the golden strings
those sources publish.

Chat templates (the processor's ``chat_template``):

- Qwen2-VL-*-Instruct and Qwen2.5-VL-*-Instruct ship the same template: a conversation that does not start
  with a system message gets ``You are a helpful assistant.``; each image is
  ``<|vision_start|><|image_pad|><|vision_end|>`` (``Picture n: `` before it with ``add_vision_id``); the
  generation prompt is ``<|im_start|>assistant\\n``. Golden strings: huggingface/transformers
  ``docs/source/en/model_doc/qwen2_vl.md`` at commit 0161d48bc37499b7cde929f93a61cf75667287f3 (the
  "Excepted output" of its multi-image conversation, with and without ``add_vision_id``).
  The Jinja is ``vlm_grpoma.models.tiny.CHAT_TEMPLATE``, which renders those strings exactly.
- Qwen3-VL-*-Instruct and Qwen3-VL-*-Thinking: no default system message; the same image placeholders;
  generation prompt ``<|im_start|>assistant\\n`` (Instruct) or ``<|im_start|>assistant\\n<think>\\n``
  (Thinking, so the model starts inside the thought and writes only ``</think>``); Thinking renders the
  reply after the last user turn as ``<think>\\n{reasoning}\\n</think>\\n\\n{content}``. Source:
  ollama/ollama ``model/renderers/qwen3vl.go`` at commit fb30760996871fa9460115c753afd2c60d4ab0f7 (a port
  of both Hugging Face templates) and its golden tests ``qwen3vl_thinking_test.go`` /
  ``qwen3vl_nonthinking_test.go`` (last changed at 6bdb73073b8cb2a5430b9e2524f3e9debac39953); a verbatim
  copy of the Thinking template found in the code index agrees. The Jinja below is written from that format
  and keeps what our prompts and replies exercise (system, user, image/video/text items, the reasoning split
  of an assistant reply, the generation prompt); the tool-calling branch is left out.

Vocabularies (ids 151643 and up; the 151,643 BPE ranks are shared by all three generations):

- Qwen2-VL: the 14 special tokens 151643 ``<|endoftext|>`` … 151656 ``<|video_pad|>``; ``<think>`` and
  ``</think>`` are several BPE pieces (``</think>`` = 522, 26865, 29).
- Qwen2.5-VL: plus 151657–151664 (``<tool_call>`` … ``<|file_sep|>``), plain added tokens.
- Qwen3-VL: plus 151665 ``<tool_response>``, 151666 ``</tool_response>``, 151667 ``<think>``,
  151668 ``</think>``, all ``"special": false`` — as in the released Qwen3 ``tokenizer_config.json``
  ``added_tokens_decoder`` (copy: akougkas/warpio-cli ``warpio-docs/ai-docs/model_cards/qwen3:4b.md`` at
  commit 8dde6d21c14ca1c2167e7f8c86370e54fdbbc537); a Qwen3-VL-30B-A3B-Instruct load log in
  ikawrakow/ik_llama.cpp issue #919 reports the same 26 special/added tokens (151643–151668).

How we reproduce the ids: the real vocabularies come from :func:`vlm_grpoma.models.qwen_vocab.build_qwen_tokenizer`
(the dashscope wheel's Qwen2 ranks, the special tokens added one at a time in id order, then each
generation's added tokens in id order, so ``<think>`` lands on 151667 exactly). The tiny vocabularies (a BPE
trained offline, for models that run fast) mimic the same split: Qwen2/2.5-style ones leave the tags to BPE
pieces, the Qwen3-style one adds ``<think>``/``</think>`` as single plain tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlm_grpoma.models.chat_format import CHAT_TEMPLATE
from vlm_grpoma.models.tiny import PRESETS, build_processor, build_tokenizer

_QWEN3_VL_HEAD = (
    "{%- set counts = namespace(image=0, video=0) -%}"
    "{%- set ns = namespace(last_query_index=-1) -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'user' -%}{%- set ns.last_query_index = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- macro render(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- else -%}{%- for item in content -%}"
    "{%- if 'image' in item or 'image_url' in item or item.type == 'image' -%}"
    "{%- set counts.image = counts.image + 1 -%}"
    "{%- if add_vision_id -%}{{- 'Picture ' ~ counts.image ~ ': ' -}}{%- endif -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif 'video' in item or item.type == 'video' -%}"
    "{%- set counts.video = counts.video + 1 -%}"
    "{%- if add_vision_id -%}{{- 'Video ' ~ counts.video ~ ': ' -}}{%- endif -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif 'text' in item -%}{{- item.text -}}"
    "{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- for message in messages -%}"
    "{%- set content = render(message.content) -%}"
    "{%- if message.role == 'assistant' -%}"
)
_QWEN3_VL_TAIL = "{{- '<|im_end|>\\n' -}}{%- else -%}{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' -}}{%- endif -%}{%- endfor -%}"

#: Qwen3-VL-*-Instruct: replies as written; the model opens its own thought (if any).
QWEN3_VL_INSTRUCT_TEMPLATE = (
    _QWEN3_VL_HEAD
    + "{{- '<|im_start|>assistant\\n' + content -}}"
    + _QWEN3_VL_TAIL
    + "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

#: Qwen3-VL-*-Thinking: the reply after the last user turn carries its reasoning in a think block; the
#: generation prompt opens the thought.
QWEN3_VL_THINKING_TEMPLATE = (
    _QWEN3_VL_HEAD
    + "{%- set reasoning = message.reasoning_content if message.reasoning_content is string else '' -%}"
    "{%- if not reasoning and '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning) -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') -}}"
    "{%- else -%}{{- '<|im_start|>assistant\\n' + content -}}{%- endif -%}"
    + _QWEN3_VL_TAIL
    + "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n<think>\\n' -}}{%- endif -%}"
)


@dataclass(frozen=True)
class Release:
    """One published Qwen-VL release kind: its family, chat template, vocabulary generation and behaviour."""

    name: str
    arch: str
    template: str
    vocabulary: str  # a key of vlm_grpoma.models.qwen_vocab.VOCABULARIES
    default_system: bool  # the template inserts "You are a helpful assistant." when no system message leads
    opens_thought: bool  # the generation prompt ends inside an opened <think>

    @property
    def think_tags_are_tokens(self) -> bool:
        return self.vocabulary == "qwen3"


RELEASES = (
    Release("Qwen2-VL-Instruct", "qwen2_vl", CHAT_TEMPLATE, "qwen2", True, False),
    Release("Qwen2.5-VL-Instruct", "qwen2_5_vl", CHAT_TEMPLATE, "qwen2_5", True, False),
    Release("Qwen3-VL-Instruct", "qwen3_vl", QWEN3_VL_INSTRUCT_TEMPLATE, "qwen3", False, False),
    Release("Qwen3-VL-Thinking", "qwen3_vl", QWEN3_VL_THINKING_TEMPLATE, "qwen3", False, True),
)
BY_NAME = {r.name: r for r in RELEASES}


def tiny_tokenizer(release: Release, seed: int = 0):
    """A fast BPE vocabulary with the release's template; the think tags are single tokens only for Qwen3."""
    added = ("<think>", "</think>") if release.think_tags_are_tokens else ()
    return build_tokenizer(
        seed, PRESETS["tiny"].bpe_vocab, added_tokens=added, chat_template=release.template
    )


def real_tokenizer(release: Release):
    """The release's real vocabulary (needs the dashscope wheel) with its chat template."""
    from vlm_grpoma.models.qwen_vocab import load_qwen_tokenizer

    tokenizer = load_qwen_tokenizer(release.vocabulary)
    tokenizer.chat_template = release.template
    return tokenizer


def processor(release: Release, tokenizer=None):
    """The family's processor around ``tokenizer`` (default: the tiny one) with the release's template."""
    return build_processor(release.arch, tokenizer or tiny_tokenizer(release))
