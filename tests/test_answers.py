"""Answer extraction, parsing and formatting: hand-written edge cases plus hypothesis properties."""

from __future__ import annotations

import json
import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vlm_grpoma.answers import (
    MAX_ANSWER_CHARS,
    MAX_BOXES,
    MAX_COORDINATE,
    MAX_POINTS,
    MAX_TEXT_CHARS,
    Box,
    Boxes,
    ContactAction,
    ParseError,
    Points,
    Trajectory,
    answers_of_kind,
    extract_answer,
    format_answer,
    parse_answer,
)

KINDS = ("boxes", "points", "trajectory", "contact_action")


def reason(result) -> str:
    assert isinstance(result, ParseError), f"expected a ParseError, got {result!r}"
    return result.reason


# --- extract_answer -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>a</think><answer>[1, 2]</answer>", "[1, 2]"),
        ("<answer>\n  [1, 2]  \n</answer>", "[1, 2]"),
        ("<answer>```json\n[1, 2]\n```</answer>", "[1, 2]"),
        ("<answer>```\n[1, 2]\n```</answer>", "[1, 2]"),
        ("<answer>```json [1, 2]```</answer>", "[1, 2]"),
        ("<answer>```json\n[1, 2]</answer>", "[1, 2]"),  # unclosed fence
        ("<answer>[1, 2]</answer> trailing words <|im_end|>", "[1, 2]"),
        ("</answer><answer>[3]</answer>", "[3]"),  # a stray closing tag before the answer is ignored
        ("<answer>[1, 2]", "[1, 2]"),  # missing closing tag, nothing after
        ("<answer>[1, 2]\n\n", "[1, 2]"),
    ],
)
def test_extract_answer_accepts(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "text, why",
    [
        ("no tags at all", "no_answer_tag"),
        ("[1, 2]</answer>", "no_answer_tag"),
        ("<answer>[1]</answer><answer>[2]</answer>", "multiple_answers"),
        ("<answer>[1]<answer>[2]</answer>", "multiple_answers"),
        ("<answer></answer>", "empty_answer"),
        ("<answer>   \n </answer>", "empty_answer"),
        ("<answer>```json\n```</answer>", "empty_answer"),
        ("<answer>[1, 2] </think> more", "unclosed_answer"),
        ("<answer>[1, 2]<|im_end|>", "unclosed_answer"),
    ],
)
def test_extract_answer_rejects(text, why):
    assert reason(extract_answer(text)) == why


# --- parse_answer: accepted forms ---------------------------------------------------------------------------


def test_parse_boxes_canonical_and_tolerant_forms():
    expected = Boxes((Box(1, 2, 3, 4, "cup"),))
    assert parse_answer('[{"bbox_2d": [1, 2, 3, 4], "label": "cup"}]', "boxes") == expected
    assert parse_answer('{"bbox_2d": [1, 2, 3, 4], "label": "cup"}', "boxes") == expected  # single dict
    assert parse_answer("[1, 2, 3, 4]", "boxes") == Boxes((Box(1, 2, 3, 4),))  # bare box
    assert parse_answer("[[1, 2, 3, 4], [5, 6, 7.5, 8]]", "boxes") == Boxes(
        (Box(1, 2, 3, 4), Box(5, 6, 7.5, 8))
    )
    assert parse_answer("[]", "boxes") == Boxes(())  # "nothing there" is a valid detection answer
    full = '<think>the cup is left</think>\n<answer>\n```json\n[{"bbox_2d": [1, 2, 3, 4]}]\n```\n</answer>'
    assert parse_answer(full, "boxes") == Boxes((Box(1, 2, 3, 4),))


def test_parse_keeps_int_and_float_types():
    b = parse_answer("[1, 2.0, 3, 4.5]", "boxes").boxes[0]
    assert type(b.x1) is int and type(b.y1) is float and b.x2 == 3 and b.y2 == 4.5


def test_parse_points_forms():
    assert parse_answer('[{"point_2d": [3, 4]}, {"point_2d": [5, 6], "label": "x"}]', "points") == Points(
        ((3, 4), (5, 6))
    )
    assert parse_answer('{"point_2d": [3, 4]}', "points") == Points(((3, 4),))
    assert parse_answer("[3, 4]", "points") == Points(((3, 4),))
    assert parse_answer("[[3, 4], [5, 6]]", "points") == Points(((3, 4), (5, 6)))


def test_parse_trajectory_forms():
    assert parse_answer("[[0, 0], [1, 1], [2, 3]]", "trajectory") == Trajectory(((0, 0), (1, 1), (2, 3)))
    assert parse_answer('[{"point_2d": [0, 0]}, [1, 1]]', "trajectory") == Trajectory(((0, 0), (1, 1)))


def test_parse_contact_action_normalises_directions():
    a = parse_answer('{"point_2d": [10, 20], "up": [0, 0, 2], "forward": [3, 4, 0]}', "contact_action")
    assert a == ContactAction((10, 20), (0.0, 0.0, 1.0), (0.6, 0.8, 0.0))
    tiny = parse_answer(
        '[{"point_2d": [1, 2], "up": [1e-320, 1e-320, 0], "forward": [1e300, 1e300, 1e300]}]',
        "contact_action",
    )
    assert math.isclose(math.hypot(*tiny.up), 1.0) and math.isclose(tiny.up[0], tiny.up[1])
    assert math.isclose(math.hypot(*tiny.forward), 1.0)


# --- parse_answer: rejected forms --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, kind, why",
    [
        ("", "boxes", "empty_answer"),
        ("   ", "points", "empty_answer"),
        ("[1, 2, 3", "boxes", "invalid_json"),
        ("{'bbox_2d': [1, 2, 3, 4]}", "boxes", "invalid_json"),  # single quotes are not JSON
        ("[NaN, 1, 2, 3]", "boxes", "non_finite"),
        ("[Infinity, 1, 2, 3]", "boxes", "non_finite"),
        ("[-Infinity, 1]", "points", "non_finite"),
        ("[1e400, 1, 2, 3]", "boxes", "non_finite"),
        ("[1" + "0" * 400 + ", 1]", "points", "non_finite"),  # an int too large for a float
        ("[1" + "0" * 5000 + ", 1]", "points", "invalid_json"),  # beyond Python's int digit limit
        ('[{"bbox_2d": [1, 2, 3]}]', "boxes", "bad_shape"),
        ('[{"bbox_2d": [1, 2, 3, 4, 5]}]', "boxes", "bad_shape"),
        ('[{"bbox": [1, 2, 3, 4]}]', "boxes", "missing_field"),
        ('[{"bbox_2d": [1, 2, 3, 4], "score": 0.9}]', "boxes", "unknown_field"),
        ('[{"bbox_2d": [1, 2, 3, 4], "label": 7}]', "boxes", "bad_label"),
        ('[{"bbox_2d": ["1", 2, 3, 4]}]', "boxes", "not_a_number"),
        ('[{"bbox_2d": [true, 2, 3, 4]}]', "boxes", "not_a_number"),
        ('[{"bbox_2d": [null, 2, 3, 4]}]', "boxes", "not_a_number"),
        ("[5, 2, 3, 4]", "boxes", "degenerate_box"),  # x2 < x1
        ("[1, 2, 1, 4]", "boxes", "degenerate_box"),  # zero width
        ("[1, 4, 3, 4]", "boxes", "degenerate_box"),  # zero height
        ('"a box"', "boxes", "bad_shape"),
        ("42", "points", "bad_shape"),
        ("[]", "points", "no_points"),
        ("[[1, 2, 3]]", "points", "bad_shape"),
        ('[{"point": [1, 2]}]', "points", "missing_field"),
        ("[[0, 0]]", "trajectory", "too_few_points"),
        ("[0, 0]", "trajectory", "too_few_points"),
        ("[]", "trajectory", "too_few_points"),
        ('{"a": 1}', "trajectory", "bad_shape"),
        ('{"point_2d": [1, 2], "up": [0, 0, 0], "forward": [1, 0, 0]}', "contact_action", "zero_direction"),
        ('{"point_2d": [1, 2], "up": [0, 0, 1]}', "contact_action", "missing_field"),
        ('{"point_2d": [1, 2], "up": [0, 1], "forward": [1, 0, 0]}', "contact_action", "bad_shape"),
        ('[{"point_2d": [1, 2], "up": [0, 0, 1], "forward": [1, 0, 0]}, {}]', "contact_action", "bad_shape"),
        ("[" * 5000 + "]" * 5000, "boxes", "invalid_json"),  # deeply nested
        ("<think>x</think>", "boxes", "no_answer_tag"),
    ],
)
def test_parse_rejects(text, kind, why):
    assert reason(parse_answer(text, kind)) == why


def test_caps_on_answer_size():
    many_boxes = json.dumps([[0, 0, 1, 1]] * (MAX_BOXES + 1))
    assert reason(parse_answer(many_boxes, "boxes")) == "too_many_boxes"
    assert isinstance(parse_answer(json.dumps([[0, 0, 1, 1]] * MAX_BOXES), "boxes"), Boxes)
    many_points = json.dumps([[0, 0]] * (MAX_POINTS + 1))
    assert reason(parse_answer(many_points, "trajectory")) == "too_many_points"
    assert reason(parse_answer(many_points, "points")) == "too_many_points"
    assert reason(parse_answer("[" + " " * 200_000 + "1, 2]", "points")) == "too_long"


def test_caps_are_inclusive_at_exactly_the_limit():
    """Each cap allows exactly its limit and refuses one more: characters of the text and of the answer
    body, points of a trajectory, and the coordinate magnitude rewards accept."""
    body = "[[0, 0, 1, 1]]"
    at = "[" + " " * (MAX_ANSWER_CHARS - len(body)) + body[1:]
    assert len(at) == MAX_ANSWER_CHARS and isinstance(parse_answer(at, "boxes"), Boxes)
    assert reason(parse_answer("[ " + at[1:], "boxes")) == "too_long"
    text = f"<answer>{body}</answer>"
    padded = text + " " * (MAX_TEXT_CHARS - len(text))
    assert len(padded) == MAX_TEXT_CHARS and isinstance(parse_answer(padded, "boxes"), Boxes)
    assert reason(parse_answer(padded + " ", "boxes")) == "too_long"
    path = [[i % 7, i % 5] for i in range(MAX_POINTS)]
    assert len(parse_answer(json.dumps(path), "trajectory").points) == MAX_POINTS
    assert reason(parse_answer(json.dumps([*path, [0, 0]]), "trajectory")) == "too_many_points"
    edge = [
        Points(((MAX_COORDINATE, -MAX_COORDINATE),)),
        Points(((math.nextafter(MAX_COORDINATE, math.inf), 0),)),
    ]
    indices, _, failures = answers_of_kind(edge, "points")
    assert indices == [0] and failures == {"coordinate_range": 1}


def test_bounds_tolerance_is_one_unit():
    assert isinstance(parse_answer("[0, 0, 1001, 1000]", "boxes", bounds=(1000, 1000)), Boxes)
    assert isinstance(parse_answer("[-1, -1, 10, 10]", "boxes", bounds=(1000, 1000)), Boxes)
    assert reason(parse_answer("[0, 0, 1001.5, 10]", "boxes", bounds=(1000, 1000))) == "out_of_bounds"
    assert reason(parse_answer("[-1.01, 0, 10, 10]", "boxes", bounds=(1000, 1000))) == "out_of_bounds"
    # width and height are separate: y up to 601 is fine for a 800 x 600 frame, x = 801 too, x = 802 not
    assert isinstance(parse_answer("[[801, 601], [0, 0]]", "trajectory", bounds=(800, 600)), Trajectory)
    assert reason(parse_answer("[[0, 602], [0, 0]]", "trajectory", bounds=(800, 600))) == "out_of_bounds"
    assert reason(parse_answer("[802, 10]", "points", bounds=(800, 600))) == "out_of_bounds"
    act = '{"point_2d": [900, 10], "up": [0, 0, 1], "forward": [1, 0, 0]}'
    assert reason(parse_answer(act, "contact_action", bounds=(800, 600))) == "out_of_bounds"
    assert isinstance(parse_answer(act, "contact_action"), ContactAction)  # no bounds, no check


def test_unknown_kind_is_a_caller_error():
    with pytest.raises(ValueError, match="unknown answer kind"):
        parse_answer("[1, 2]", "polygon")


def test_non_string_input_is_a_parse_error():
    assert reason(parse_answer(None, "boxes")) == "not_text"
    assert reason(parse_answer(b"[1, 2]", "points")) == "not_text"


# --- format_answer ----------------------------------------------------------------------------------------


def test_format_answer_canonical_text():
    assert (
        format_answer(Boxes((Box(1, 2, 3, 4, "cup"), Box(0.5, 1, 2, 3))))
        == '[{"bbox_2d": [1, 2, 3, 4], "label": "cup"}, {"bbox_2d": [0.5, 1, 2, 3]}]'
    )
    assert format_answer(Points(((3, 4),))) == '[{"point_2d": [3, 4]}]'
    assert format_answer(Trajectory(((0, 0), (1.5, 2)))) == "[[0, 0], [1.5, 2]]"
    assert (
        format_answer(ContactAction((1, 2), (0, 0, 1), (1.0, 0.0, 0.0)))
        == '{"point_2d": [1, 2], "up": [0, 0, 1], "forward": [1.0, 0.0, 0.0]}'
    )
    assert format_answer(Boxes(())) == "[]"
    assert (
        format_answer(Boxes((Box(1, 2, 3, 4, "tasse für café"),)))
        == '[{"bbox_2d": [1, 2, 3, 4], "label": "tasse für café"}]'
    )


def test_format_answer_accepts_numpy_scalars_and_rejects_nan():
    np = pytest.importorskip("numpy")
    assert format_answer(Points(((np.int64(3), np.float32(0.5)),))) == '[{"point_2d": [3, 0.5]}]'
    with pytest.raises(ValueError):
        format_answer(Points(((float("nan"), 1),)))


# --- answers_of_kind --------------------------------------------------------------------------------------


def test_answers_of_kind_counts_failures():
    answers = [
        Points(((1, 2),)),
        ParseError("invalid_json"),
        Boxes(()),
        ParseError("invalid_json"),
        Points(((float("inf"), 2),)),
        Points(((1e8, 2),)),
        Points(((5, 6),)),
    ]
    indices, valid, failures = answers_of_kind(answers, "points")
    assert indices == [0, 6] and valid == [answers[0], answers[6]]
    assert failures == {"invalid_json": 2, "wrong_kind": 1, "coordinate_range": 2}


# --- properties -------------------------------------------------------------------------------------------

coordinate = st.one_of(
    st.integers(-(10**6), 10**6), st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)
)


@st.composite
def boxes_answers(draw):
    boxes = []
    for _ in range(draw(st.integers(0, 6))):
        x1, y1 = draw(coordinate), draw(coordinate)
        w, h = draw(st.floats(1e-3, 1e4)), draw(st.floats(1e-3, 1e4))
        x2, y2 = x1 + w, y1 + h
        if x2 <= x1 or y2 <= y1:  # float rounding of a huge coordinate plus a small size
            continue
        boxes.append(Box(x1, y1, x2, y2, draw(st.text(max_size=12))))
    return Boxes(tuple(boxes))


points_list = st.lists(st.tuples(coordinate, coordinate), min_size=1, max_size=20).map(tuple)
direction = st.tuples(coordinate, coordinate, coordinate).filter(lambda v: any(v))
answers = st.one_of(
    boxes_answers(),
    points_list.map(Points),
    st.lists(st.tuples(coordinate, coordinate), min_size=2, max_size=20).map(tuple).map(Trajectory),
    st.builds(
        lambda p, u, f: ContactAction(p, u, f), st.tuples(coordinate, coordinate), direction, direction
    ),
)
KIND_OF = {Boxes: "boxes", Points: "points", Trajectory: "trajectory", ContactAction: "contact_action"}


@settings(max_examples=300, deadline=None, derandomize=True)
@given(answers)
def test_round_trip(answer):
    kind = KIND_OF[type(answer)]
    text = format_answer(answer)
    for wrapped in (text, f"<think>why</think><answer>{text}</answer>", f"<answer>```json\n{text}\n```"):
        parsed = parse_answer(wrapped, kind)
        if isinstance(answer, ContactAction):
            # directions come back normalised; the point exactly
            assert parsed.point == answer.point
            for got, sent in ((parsed.up, answer.up), (parsed.forward, answer.forward)):
                norm = math.hypot(*(float(v) for v in sent))
                assert all(math.isclose(g, s / norm, abs_tol=1e-12) for g, s in zip(got, sent))
        else:
            assert parsed == answer
            assert format_answer(parsed) == text


json_ish = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(
            st.sampled_from(["bbox_2d", "point_2d", "label", "up", "forward", "x"]), children, max_size=4
        ),
    ),
    max_leaves=30,
)
tag_soup = st.lists(
    st.sampled_from(
        [
            "<think>",
            "</think>",
            "<answer>",
            "</answer>",
            "```json\n",
            "```",
            "[",
            "]",
            "{",
            "}",
            ",",
            "1",
            "-2.5",
            "NaN",
            "1e999",
            '"bbox_2d":',
            '"point_2d":',
            " ",
            "\n",
            "<|im_end|>",
            "null",
            "true",
        ]
    ),
    max_size=40,
).map("".join)


@settings(max_examples=600, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(st.text(max_size=200), tag_soup, json_ish.map(lambda v: json.dumps(v))),
    st.sampled_from(KINDS),
    st.one_of(st.none(), st.just((1000, 1000))),
)
def test_parse_never_raises(text, kind, bounds):
    result = parse_answer(text, kind, bounds)
    assert isinstance(result, (Boxes, Points, Trajectory, ContactAction, ParseError))
    if not isinstance(result, ParseError):
        assert (
            type(result)
            is {"boxes": Boxes, "points": Points, "trajectory": Trajectory, "contact_action": ContactAction}[
                kind
            ]
        )
        # whatever parsed is well-formed: it formats and re-parses to an equal kind of answer
        assert not isinstance(parse_answer(format_answer(result), kind), ParseError)
    else:
        assert result.reason and isinstance(result.reason, str)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.text(max_size=300))
def test_extract_answer_never_raises(text):
    result = extract_answer(text)
    assert isinstance(result, (str, ParseError))
    if isinstance(result, str):
        assert result == result.strip() and result


def test_labels_that_look_like_tags_survive_wrapping():
    answer = Boxes((Box(1, 2, 3, 4, "</answer><answer>"),))
    text = format_answer(answer)
    assert "<" not in text
    assert parse_answer(f"<think>t</think><answer>{text}</answer>", "boxes") == answer
    assert parse_answer(f"<answer>{text}", "boxes") == answer


@pytest.mark.parametrize(
    "text",
    [
        "```\n" + " " * 90_000 + "x",  # a backtracking fence regex would be quadratic here
        "```json" + " \t" * 40_000 + "[1, 2]" + " " * 9_000 + "```",
        "<answer>" + "</x" * 300_000,
        "<answer>" + "<" * 99_000,
        "[" * 50_000 + "]" * 49_000,
        "x" * 2_000_000,
    ],
)
def test_adversarial_inputs_are_fast(text):
    start = time.perf_counter()
    result = parse_answer(text, "points")
    assert time.perf_counter() - start < 0.5
    assert isinstance(result, (Points, ParseError))
