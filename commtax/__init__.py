"""commtax: the helper package of "The Communication Tax" course.

Formulas (``collectives``), the message-level simulator (``simulate``), link
presets (``links``), the distributed runner (``launch``), and the widget and
plot glue the lessons share (``widgets``, ``plots``).
"""
