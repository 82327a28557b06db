"""The one fixture every lab test uses: ``lab``, the module under test.

``lab`` is the ``starter.py`` or ``solution.py`` of the lab folder the test
file sits in (or under: the grader puts hidden tests in ``labs/LAB/hidden/``),
as ``LAB_IMPL`` says (see ``commtax/labs.py``). Tests never import either
file directly, so the same test checks the reference and the learner's code.
"""

import pytest

from commtax.labs import load_lab


@pytest.fixture(scope="module")
def lab(request):
    folder = next(p for p in request.path.parents if p.name.startswith("lab-"))
    return load_lab(folder)
