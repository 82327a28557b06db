"""The answers to the lessons' exercises: scrambled (``records.encode``), or computed from the course's model.

A few answers follow the course's network model as it evolves (Lesson 04's plans, Lesson 10's predictor):
those are computed by :mod:`commtax.exercises.hidden.model` when checked. To change a stored answer,
``python -m commtax.exercises encode 01.1 VALUE`` prints the new scrambled value.
"""

from __future__ import annotations

from collections.abc import Callable

import commtax.exercises.hidden.model as model

ANSWERS: dict[str, str | Callable[[], float]] = {
    # Lesson 01
    "01.1": "1jE0qsJngQE=",
    "01.2": "hHKn6GpFJ0g=",
    "01.3": "Mih9JV58rqo=",
    "01.4": "qYoA8IQBUtw=",
    "01.5": "2z6d8+gIrNk=",
    # Lesson 02
    "02.1": "/y30EvcGgNc=",
    "02.2": "7y8X9kreb9g=",
    "02.3": "9O/LcKTQDyw=",
    "02.4": "7qVJRTkpkEU=",
    "02.5": "OzsnRy3ynMI=",
    # Lesson 03
    "03.1": "gsZDKTns+88=",
    "03.2": "ggPkhcshSqQ=",
    "03.3": "43ZU+AIQqBw=",
    "03.4": "S6aQ8pZG0x8=",
    "03.5": "d0kfRl/HGnk=",
    # Lesson 04
    "04.1": "yPcnaJPblN4=",
    "04.2": "W1DjGZTwGRQ=",
    "04.3": lambda: model.lesson04_plan(8, 4).mfu,
    "04.4": lambda: model.lesson04_plan(16, 2).axes["TP"].tax,
    # Lesson 05
    "05.1": "S/fEN47GXNw=",
    "05.2": "zkUzOybhK8E=",
    "05.3": "6ckglbWmSlo=",
    "05.4": "cd4UbtS1dvA=",
    "05.5": "NJ7xS6m2SBg=",
    # Lesson 06
    "06.1": "DAxrhCLsddQ=",
    "06.2": "QwBoe0Pofoc=",
    "06.3": "/U3PrCfA4j4=",
    "06.4": "v8azHhxKrgw=",
    "06.5": "jravudNjH+A=",
    # Lesson 07
    "07.1": "gRTcd4+Ygoc=",
    "07.2": "7BV86JXxAHU=",
    "07.3": "jwbdNY+ihNc=",
    "07.4": "DSD0ZLVPlTA=",
    # Lesson 08
    "08.1": "M3+9KavCEDk=",
    "08.2": "vRVJpLzQvNo=",
    "08.3": model.lesson08_exposed_across_nodes,
    "08.4": "xVOfkscX5CY=",
    "08.5": "0qiF7lF4lYk=",
    # Lesson 09
    "09.1": "aW1J/pAOr6s=",
    "09.2": "yKJBIn5a+X0=",
    "09.3": "8UwJyTlyRIA=",
    "09.4": "e5YbJx63nVQ=",
    "09.5": "9fdmwQ6BJMY=",
    # Lesson 10 (answers follow the course's predictor, commtax.formulas.predict)
    "10.1": lambda: model.lesson10_best(None)["mfu"],
    "10.2": model.lesson10_zero3_halved,
    "10.3": "PYdy20wYaYI=",
    "10.4": "lxS1LBXUVSk=",
    "10.5": lambda: model.lesson10_deepseek_b200_best(),
    "10.6": lambda: model.lesson10_deepseek_h800(ep_overlap=True),
    # Lesson 11
    "11.1": "CY6cBW3iAJg=",
    "11.2": "pU0mEOgju1E=",
    "11.3": "5WvHPguHJsA=",
    "11.4": "jKOeAYyvjmo=",
    # Lesson 12 (12.2 and 12.5 follow the course's model, commtax.formulas.context)
    "12.1": "av4V3IW/wSU=",
    "12.2": model.lesson12_crossover,
    "12.3": "b4p1hvLbrPQ=",
    "12.4": "sLT1UKdym/o=",
    "12.5": model.lesson12_modeler_case,
    # Lesson 13
    "13.1": "OoxH5Xicpso=",
    "13.2": "oJifRExV6UM=",
    "13.3": "Nc4eX7yo8/k=",
    "13.4": "hpVvf86/4g4=",
    "13.5": "CujP0om9sQk=",
}
