"""Scores shown on the scale people press (issue 25): core.domain.rubric.scale_point is the reverse of
normalise, and core.records.review.labeling.label_score puts a task's label values on its labelling scale."""

from __future__ import annotations

import pytest

from core.domain.rubric import normalise, scale_point
from core.records.review.labeling import label_score
from storage.tables import Task


@pytest.mark.parametrize(("scale", "points"), [("1-5", range(1, 6)), ("binary", range(0, 2))])
def test_scale_point_gives_back_the_score_a_person_pressed(scale, points):
    assert [scale_point(normalise(point, scale), scale) for point in points] == list(points)


def test_a_value_between_the_points_stays_between_them():
    assert scale_point(0.4375, "1-5") == 2.75


def test_a_tasks_label_values_read_on_its_labelling_scale():
    five = Task(name="t", instructions="", reward_method="human", reward_settings={"scale": "1-5"})
    binary = Task(name="b", instructions="", reward_method="human", reward_settings={"scale": "binary"})
    rubric = Task(name="r", instructions="", reward_method="rubric", kind="conversation", reward_settings={})
    assert [label_score(five, v) for v in (0.0, 0.25, 0.75, 1.0, None)] == [1, 2, 4, 5, None]
    assert [label_score(binary, v) for v in (0.0, 1.0)] == [0, 1]
    assert label_score(rubric, 0.4375) == 2.75  # a weighted mean, on the 1-5 grid rubric decisions use
