import numpy as np
import pyarrow as pa
import pytest

from formats.errors import ColumnNameError, FormatError
from formats.sequence import ColumnSpec, check_unique_columns, column_name, rebased_timestamps, safe_sequence_id


@pytest.mark.parametrize(
    "key, camera, expected",
    [
        ("observation.state", False, "obs_state"),
        ("observation.state.joint_pos", False, "obs_joint_pos"),
        ("observation/state", False, "obs_state"),
        ("steps/observation/state", False, "obs_state"),
        ("observation.images.front", True, "video_front"),
        ("observation/image_0", True, "video_image_0"),
        ("observation/wrist_image", True, "video_wrist_image"),
        ("observation.image", True, "video_image"),
        ("episode_metadata/file_path", False, "file_path"),
        ("action/world_vector", False, "action_world_vector"),
        ("action", False, "action"),
        ("next.reward", False, "next_reward"),
        ("observation.effortLeft", False, "obs_effort_left"),
        ("Weird Key!", False, "weird_key"),
    ],
)
def test_column_name_rules(key, camera, expected):
    assert column_name(key, camera=camera) == expected


def test_collision_is_an_error_naming_both_sources():
    columns = [ColumnSpec.steps("next_reward", pa.float32(), source="next.reward"),
               ColumnSpec.steps("next_reward", pa.float32(), source="next/reward")]
    with pytest.raises(ColumnNameError, match=r"'next.reward' and 'next/reward' both map to column 'next_reward'"):
        check_unique_columns(columns)


def test_safe_sequence_id():
    assert safe_sequence_id("ep 1/ä:b") == "ep_1___b"


@pytest.mark.parametrize("raw, fps, message", [
    ([np.nan, 0.1, 0.2], 10.0, r"^timestamp: non-finite value nan at step 0$"),
    ([0.0, 0.1, np.inf], 10.0, r"^timestamp: non-finite value inf at step 2$"),
    ([0.3, 0.2, 0.1], 10.0, r"^timestamp: not strictly increasing at step 1 \(value 0.3 then 0.2\)$"),
    ([0.0, 0.1, 0.2, 0.15, 0.4], 10.0, r"^timestamp: not strictly increasing at step 3 \(value 0.2 then 0.15\)$"),
    ([0.0, 0.1, 0.1, 0.2], None, r"^timestamp: not strictly increasing at step 2 \(value 0.1 then 0.1\)$"),
    ([-0.2, -0.1, -0.3], None, r"not strictly increasing at step 2 \(value -0.1 then -0.3\)"),
    ([0.0, 0.05, 0.1, 0.15], 10.0, r"^timestamp: median step 0.05 s contradicts the declared 10 fps \(0.1 s a step\) by more than 10%$"),
    ([0.0, 0.1, 0.2], 30.0, r"median step 0.1 s contradicts the declared 30 fps"),
])
def test_rebased_timestamps_refuses_a_clock_it_cannot_rebase(raw, fps, message):
    with pytest.raises(FormatError, match=message):
        rebased_timestamps(np.array(raw), fps)


def test_rebased_timestamps_values():
    raw = np.array([5.0, 5.1, 5.2, 5.35, 5.4])  # a forward gap is allowed, the median matches 10 fps
    assert rebased_timestamps(raw, 10.0).tobytes() == (raw - raw[0]).tobytes()
    ns = np.array([1_571_846_881_502_692_276, 1_571_846_881_602_692_276, 1_571_846_881_702_700_000], np.int64)
    got = rebased_timestamps(ns, 10.0, units_per_second=1e9)
    assert got.dtype == np.float64 and got.tobytes() == ((ns - ns[0]) / 1e9).tobytes()  # int64 subtraction: exact
    assert rebased_timestamps(np.array([2.5]), 30.0).tolist() == [0.0]  # one step: nothing to compare the rate with
    assert rebased_timestamps(np.array([0.0, 0.0909, 0.1818]), 10.0).tolist() == [0.0, 0.0909, 0.1818]  # within 10 %
    with pytest.raises(FormatError, match=r"^frames.timestamp: not strictly increasing at step 1 \(value 7 then 7\)$"):
        rebased_timestamps(np.array([7, 7]), None, name="frames.timestamp")
