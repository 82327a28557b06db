"""The lab harness: what a lab's tests use to run and judge the learner's code.

Each module holds one job:

* :mod:`~commtax.harness.labs`: find the labs and load a lab's starter or solution (``LAB_IMPL``),
  or, under the grader, the proxy that runs it in the sandbox (the finding and loading are
  :mod:`commtax.boundary.labfiles`'s, re-exported; the ``lab`` fixture's proxy and ``LAB_INPROCESS`` are here);
* :mod:`~commtax.harness.recorded`: expected values taken from the course's reference, recorded
  for the student release;
* :mod:`~commtax.harness.runs`: run a distributed job from a test (skip where the backend
  cannot run here, share one run among tests, remember a hang);
* :mod:`~commtax.harness.stubs`: is a function still the starter's stub (fail at once);
* :mod:`~commtax.harness.inputs`: inputs the ranks cannot predict (secret seeds, one stream
  each) and the bytes the kernel counted outside the ranks;
* :mod:`~commtax.harness.sections`: one job, several parts; a part that raised fails its tests once;
* :mod:`~commtax.harness.subgroups`: a learner's exception on a subgroup, in the learner's terms;
* :mod:`~commtax.harness.compare`: a learner's value against the expected one (kind, shape,
  value) and what a ratio suggests;
* :mod:`~commtax.harness.value_errors`: bad input raises a ValueError naming the bad argument;
* :mod:`~commtax.harness.verdict`: fail with a message alone;
* :mod:`~commtax.harness.browser`: the Chromium the browser tests drive.

:mod:`commtax.testing` re-exports the names a lab test imports; ``commtax.labs`` and
``commtax.recorded`` are the same modules as ``commtax.harness.labs`` and
``commtax.harness.recorded``. The harness holds no lab answer: the grader gives it to the learner's
processes (ranks import it), and it never imports :mod:`commtax.formulas`.
"""
