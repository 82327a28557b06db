"""The one fixture every lab test uses: ``lab``, the module under test.

``lab`` is the ``starter.py`` or ``solution.py`` next to the test file, as
``LAB_IMPL`` says (see ``commtax/labs.py``). Tests never import either file
directly, so the same test checks the reference and the learner's code.
"""

import pytest

from commtax.labs import load_lab


@pytest.fixture(scope="module")
def lab(request):
    return load_lab(request.path.parent)
