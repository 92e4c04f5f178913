import pyarrow as pa
import pytest

from formats.errors import ColumnNameError
from formats.sequence import ColumnSpec, check_unique_columns, column_name, safe_sequence_id


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
