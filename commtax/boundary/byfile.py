"""Pickle functions, classes and modules that live in files Python cannot import by name.

Lab files (``labs/lab-01-alpha-beta/solution.py``) and test modules collected
with pytest's ``importlib`` mode have module names that ``import`` cannot
resolve in a fresh interpreter (the folder names contain hyphens, and several
files share the basename ``test_lab.py``). Ordinary pickling stores a function
as "module name + qualified name" and would fail in the child process.

This pickler stores such objects as "module name + file path + qualified
name" instead; unpickling loads the file under the same module name (once per
process) and looks the object up. Objects from importable modules (torch,
numpy, commtax) are pickled the usual way.
"""

from __future__ import annotations

import importlib.util
import io
import pickle
import sys
import types
from pathlib import Path

from commtax.learner_process import learner_path

MAIN_ALIAS = "__commtax_main__"  # a script's __main__, loaded in a rank (multiprocessing owns "__mp_main__")


def load_module_from_file(name: str, path: str) -> types.ModuleType:
    """Return module ``name``, executing ``path`` under that name if it is not loaded yet."""
    module = sys.modules.get(name)
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name!r} from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before exec, so the module can refer to itself
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _load_object(module_name: str, path: str, qualname: str):
    obj = load_module_from_file(module_name, path)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _load_module(module_name: str, path: str):
    return load_module_from_file(module_name, path)


def _find_spec_afresh(name: str):
    """The spec ``import name`` would find, asking the finders directly.

    ``importlib.util.find_spec`` answers from ``sys.modules`` first, where a
    lab file loaded by path also sits under its name; the finders do not.
    """
    parent, _, _ = name.rpartition(".")
    search_path = None
    if parent:
        package = sys.modules.get(parent)
        search_path = getattr(package, "__path__", None)
        if search_path is None:
            return None
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        try:
            spec = find_spec(name, search_path)
        except (ImportError, ValueError):
            continue
        if spec is not None:
            return spec
    return None


def _importable_by_name(name: str, file: str | None) -> bool:
    """True when ``import name`` in a fresh interpreter would load this very file."""
    if name in ("__main__", MAIN_ALIAS):
        return False
    if file is None:
        return True  # built-in or namespace: importable by name or not at all
    spec = _find_spec_afresh(name)
    if spec is None or not spec.origin:
        return False
    return Path(spec.origin).resolve() == Path(file).resolve()


def _file_reference(module: types.ModuleType) -> tuple[str, str] | None:
    """(name to load under, file) for a module that needs loading by path, else None."""
    file = getattr(module, "__file__", None)
    if file is None:
        return None
    name = module.__name__
    if _importable_by_name(name, file):
        return None
    if name == "__main__":
        name = MAIN_ALIAS  # so the script's `if __name__ == "__main__":` block stays asleep
    return name, learner_path(Path(file).resolve())  # under the grader: the learner's copy of that file


class ByFilePickler(pickle.Pickler):
    def reducer_override(self, obj):
        if isinstance(obj, types.ModuleType):
            ref = _file_reference(obj)
            return (_load_module, ref) if ref else NotImplemented
        if isinstance(obj, (types.FunctionType, type)):
            if getattr(obj, "__module__", None) == __name__:
                return NotImplemented  # our own loaders always travel by name
            module = sys.modules.get(getattr(obj, "__module__", None) or "")
            if module is None:
                return NotImplemented
            ref = _file_reference(module)
            if ref is None:
                return NotImplemented
            if "<locals>" in obj.__qualname__ or "<lambda>" in obj.__qualname__:
                raise pickle.PicklingError(
                    f"{obj.__qualname__} is defined inside a function or is a lambda; "
                    "a rank can only run functions defined at the top level of a .py file"
                )
            return (_load_object, (ref[0], ref[1], obj.__qualname__))
        return NotImplemented


def dumps(obj) -> bytes:
    buffer = io.BytesIO()
    ByFilePickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


def check_runnable(fn) -> None:
    """Raise ValueError if ``fn`` cannot be sent to a fresh interpreter."""
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {fn!r}")
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    if (
        module is not None
        and getattr(module, "__file__", None) is None
        and not isinstance(fn, types.BuiltinFunctionType)
    ):
        raise ValueError(
            f"fn={getattr(fn, '__qualname__', fn)!r} is defined in {module.__name__!r}, which has "
            "no file (a notebook cell or an interactive session); each rank is a fresh Python "
            "process that must import it, so define it in a .py file"
        )
