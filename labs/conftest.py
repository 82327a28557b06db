"""The one fixture every lab test uses: ``lab``, the module under test, behind a process boundary.

``lab`` stands for the ``starter.py`` or ``solution.py`` of the lab folder the
test file sits in (or under: the grader puts hidden tests in
``labs/LAB/hidden/``), as ``LAB_IMPL`` says (see ``commtax/labs.py``). Tests
never import either file directly, so the same test checks the reference and
the learner's code.

It is a :class:`commtax.boundary.LabProxy`: the learner's file is imported in a
separate worker process, and ``lab.f(...)`` sends the call there. Pass and
expect plain data only (numbers, strings, lists, tuples, dicts, numpy arrays,
tensors; dataclass instances come back as read-only records). See
``commtax/boundary.py``.
"""

import pytest

from commtax.boundary import load_lab_proxy


@pytest.fixture(scope="module")
def lab(request):
    folder = next(p for p in request.path.parents if p.name.startswith("lab-"))
    proxy = load_lab_proxy(folder)
    yield proxy
    proxy.close()
