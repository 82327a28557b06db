"""A ``breakpoint()`` in the learner's code, called through the ``lab`` proxy, fails with the command that debugs it.

Behind the proxy the learner's file runs in a worker process whose stdin is not the terminal, so pdb reads
end-of-file and raises ``bdb.BdbQuit``. The failure says in one line how to run the test with the lab in the
test process instead (``LAB_INPROCESS=1``, tests/test_lab_inprocess.py), where the debugger stops.
"""

import os

import pytest

from commtax.boundary import proxy
from commtax.harness.labs import LABS_DIR, load_lab_proxy
from commtax.learner_process import SANDBOX_ENV

LAB = "lab-01-alpha-beta"
DOCSTRING = '    """Seconds to send one message of ``nbytes`` bytes over one link: alpha + n / B."""\n'


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A copy of Lab 01's starter whose p2p_time starts with ``breakpoint()``, in a folder named as the lab's."""
    source = (LABS_DIR / LAB / "starter.py").read_text()
    assert source.count(DOCSTRING) == 1, "p2p_time's docstring changed: plant the breakpoint after the new one"
    folder = tmp_path / LAB
    folder.mkdir()
    (folder / "starter.py").write_text(source.replace(DOCSTRING, DOCSTRING + "    breakpoint()\n"))
    for name in ("LAB_INPROCESS", SANDBOX_ENV, "PYTHONBREAKPOINT"):  # pdb itself, behind the proxy
        monkeypatch.delenv(name, raising=False)
    lab = load_lab_proxy(folder, "starter")
    yield lab
    lab.close()


def test_a_breakpoint_behind_the_proxy_names_lab_inprocess_and_the_command_to_run(planted):
    with pytest.raises(Exception) as info:
        planted.p2p_time(1000, 1e-6, 1e9)
    assert type(info.value).__name__ == "BdbQuit"
    assert str(info.value) == (
        "breakpoint() needs LAB_INPROCESS=1: run `LAB_INPROCESS=1 LAB_IMPL=starter pytest labs/lab-01-alpha-beta "
        "-k test_a_breakpoint_behind_the_proxy_names_lab_inprocess_and_the_command_to_run -s`"
    )


def test_the_hint_names_the_test_without_its_parameters_and_leaves_other_errors_alone(monkeypatch):
    quit_ = {"type": "BdbQuit", "mro": ["BdbQuit", "Exception"], "message": "", "traceback": ""}
    path = str(LABS_DIR / LAB / "solution.py")
    monkeypatch.setenv("PYTEST_CURRENT_TEST", f"labs/{LAB}/test_lab.py::test_p2p_time[case-3] (call)")
    assert proxy._with_breakpoint_hint(quit_, path)["message"] == (
        f"breakpoint() needs LAB_INPROCESS=1: run `LAB_INPROCESS=1 LAB_IMPL=solution pytest labs/{LAB} "
        "-k test_p2p_time -s`"
    )
    value_error = {**quit_, "type": "ValueError", "message": "nbytes must be >= 0"}
    assert proxy._with_breakpoint_hint(value_error, path) == value_error
    # Under the grader LAB_INPROCESS is refused: the message is left as it was.
    monkeypatch.setattr(proxy, "sandbox", lambda: {"learner_root": os.sep})
    assert proxy._with_breakpoint_hint(quit_, path) == quit_
