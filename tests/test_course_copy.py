"""A lesson warns when Python runs another copy of commtax than the one beside the lesson."""

import os

import commtax
from commtax.ui import another_copy

ROOT = os.path.dirname(os.path.dirname(commtax.__file__))


def test_a_lesson_beside_the_loaded_copy_runs_without_a_warning():
    assert another_copy(os.path.join(ROOT, "lessons")) is None
    assert another_copy(os.path.join(ROOT, "solutions")) is None


def test_a_lesson_of_another_copy_names_both_copies_and_the_fix(tmp_path):
    (tmp_path / "lessons").mkdir()
    (tmp_path / "commtax").mkdir()
    (tmp_path / "commtax" / "__init__.py").write_text("")
    message = another_copy(str(tmp_path / "lessons"))
    assert str(tmp_path) in message and os.path.join(ROOT, "commtax") in message
    assert f"cd {tmp_path} && python -m pip install -e ." in message


def test_a_folder_that_is_no_lesson_folder_is_left_alone(tmp_path):
    (tmp_path / "commtax").mkdir()
    (tmp_path / "commtax" / "__init__.py").write_text("")
    assert another_copy(str(tmp_path)) is None
    assert another_copy(str(tmp_path / "elsewhere")) is None
