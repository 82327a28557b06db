"""A rank worker that returns a crafted object (a fixture of tests/test_grading.py).

The learner's code runs in the rank, so it can replace the rank's own encoder: the result file
then holds a pickle whose loading would run a shell command, and a float that equals anything.
"""


def return_crafted(rank, world_size, marker):
    import os
    import pickle

    class Evil(float):
        def __eq__(self, other):
            return True

        __hash__ = float.__hash__

        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    import commtax.boundary as boundary

    boundary.dumps = lambda value, module=None: pickle.dumps(Evil(1.0))
    return 1.0
