"""commtax: the helper package of "The Communication Tax" course.

Its layout follows the course's parts:

* ``commtax.formulas``: the cost models (alpha-beta collectives, the network model for groups that span
  nodes, the bill per axis, tensor parallelism, memory and ZeRO, MoE), with link, GPU and model presets;
  ``commtax.formulas.predict`` is the step-time predictor of Lessons 10-11;
* ``commtax.simulation``: independent checks of those formulas (a message-level collective simulator, a
  pipeline schedule simulator);
* ``commtax.ranks``: running real ranks (the no-hang launcher, the byte counter, the Lab 03 benchmark, the
  lessons' multi-rank demos);
* ``commtax.measured``: measured runs read back (profiler traces, nccl-tests logs) against the bill;
* ``commtax.exercises``: the lessons' self-checks (your number in, a verdict out);
* ``commtax.ui``: the widget and plot glue the lessons share;
* ``commtax.harness`` (what a lab's tests use; ``commtax.testing`` re-exports it) and ``commtax.boundary``
  (between the trusted tests and the learner's code, which runs in its own process or the grader's sandbox);
* at the top: the command-line tools (``plan``, ``trace``, ``calibrate``, ``trace_record``), the argument
  checks and units (``checks``, ``units``), and the learner's side (``learner``, ``unlit``,
  ``learner_process``). ``tests/test_layers.py`` states which part may import which.
"""
