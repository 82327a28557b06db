"""``python -m commtax.exercises encode ...``: the scrambled form of an answer or a slip's wrong value."""

from __future__ import annotations

import sys

from commtax.exercises.records import encode


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "encode":
        exercise_id, _, slip = argv[1].partition(" ")
        if slip:  # "01.1 one phase": a slip's wrong value
            print(f'Slip("{slip}", "{encode(argv[1], float(argv[2]))}", "..."),')
        else:
            print(f'"{argv[1]}": "{encode(argv[1], float(argv[2]))}",   # in hidden/answers.py')
        return 0
    print(
        "usage: python -m commtax.exercises encode EXERCISE_ID ANSWER\n"
        '       python -m commtax.exercises encode "EXERCISE_ID SLIP NAME" WRONG_VALUE'
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
