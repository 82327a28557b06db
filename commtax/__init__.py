"""commtax: the helper package of "The Communication Tax" course.

Its layout follows the course's parts:

* ``commtax.formulas``: the cost models (alpha-beta collectives, the network
  model for groups that span nodes, the bill per axis, tensor parallelism),
  with link and model presets;
* ``commtax.simulation``: independent checks of those formulas (a
  message-level collective simulator, a pipeline schedule simulator);
* ``commtax.ranks``: running real ranks (the no-hang launcher, the byte
  counter, the Lab 03 benchmark, the lessons' multi-rank demos);
* ``commtax.ui``: the widget and plot glue the lessons share;
* at the top: ``checks`` and ``units`` (argument checks, formatting) and the
  lab harness (``labs``, ``testing``).
"""
