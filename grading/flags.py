"""Review flags for teachers: what in a learner's ``starter.py`` an honest lab solution does not need.

Some checks run inside the learner's own processes and a student who reads the
grader can forge them (grading/README.md, "Threat model": side channels through
files, padding the loopback, gloo's own collective through the ProcessGroup
object, counters bumped through closures). The sandbox closes what it can; for
the rest these flags tell a teacher **which submissions to read**. An honest
solution needs only torch, torch.distributed's documented calls, numpy, math,
a few standard modules and the lab's given helpers, so this scan reports, with
its line, every construct outside that: imports of other modules (``os``,
``sys``, ``socket``, ``ctypes``, ...), ``open``/``exec``/``eval``/``__import__``,
``getattr`` with a computed name, dunder attributes (``__closure__``,
``__globals__``, ...), private and internal torch names (``torch._C``,
``distributed_c10d``, ``_get_default_group``, ``ProcessGroup`` and its methods),
file I/O through torch or numpy, monkey-patching a module, paths such as
``/proc`` or ``/tmp`` in strings, code run at import, functions defined twice,
collectives on tensors made in the call (padding), and a file that does not parse.

The file is parsed with :mod:`ast`, never imported or run; the grader refuses
files over 1 MB, and the scan stops after :data:`NODE_LIMIT` nodes. These are
**heuristics**: they point at code to read, they prove nothing, and an
obfuscated submission can avoid some (though ``exec`` and ``getattr`` with a
computed name are flagged themselves). Flags are the teacher's only: they go to
the teacher's table and the ``grade-many`` CSV, never to what a learner sees.
"""

from __future__ import annotations

import ast
import unicodedata

# The tables below are laid out by hand (one topic per line): the formatter leaves them alone.
# fmt: off
NODE_LIMIT = 400_000   # AST nodes scanned (a 1 MB file of dense code has about 300,000)
KEPT = 100             # flags kept per file (the count says how many there were)

# What every lab may import (besides what its shipped starter imports).
ALLOWED_MODULES = frozenset({
    "__future__", "math", "cmath", "numbers", "decimal", "fractions", "statistics", "random", "time",
    "dataclasses", "typing", "collections", "collections.abc", "itertools", "functools", "operator",
    "contextlib", "enum", "abc", "copy", "heapq", "bisect", "types", "warnings",
    "numpy", "torch", "torch.nn", "torch.nn.functional", "torch.distributed", "torch.autograd",
})

# Names an honest solution never writes, anywhere (as a name, an attribute, an imported name, or a
# string given to getattr): torch.distributed's internals, the ProcessGroup object and its methods (gloo's
# own collectives, unseen by the tests' counters), frames, code objects and closures.
INTERNAL_NAMES = {
    "ProcessGroup": "the ProcessGroup object (collectives the tests do not see)",
    "ProcessGroupGloo": "the ProcessGroup object (collectives the tests do not see)",
    "ProcessGroupNCCL": "the ProcessGroup object (collectives the tests do not see)",
    "distributed_c10d": "torch.distributed's internal module",
    "c10d": "torch.distributed's internal module",
    "_get_default_group": "torch.distributed's internal default group",
    "_world": "torch.distributed's internal state",
    "_C": "torch's C extension (torch._C)",
    "allreduce": "a ProcessGroup method (gloo's own collective)",
    "allgather": "a ProcessGroup method (gloo's own collective)",
    "alltoall": "a ProcessGroup method (gloo's own collective)",
    "alltoall_base": "a ProcessGroup method (gloo's own collective)",
    "allreduce_coalesced": "a ProcessGroup method (gloo's own collective)",
    "allgather_coalesced": "a ProcessGroup method (gloo's own collective)",
    "_allgather_base": "a ProcessGroup method (gloo's own collective)",
    "_reduce_scatter_base": "a ProcessGroup method (gloo's own collective)",
    "TCPStore": "a rendezvous store (a channel beside the messages)",
    "FileStore": "a rendezvous store (a channel beside the messages)",
    "HashStore": "a rendezvous store (a channel beside the messages)",
    "PrefixStore": "a rendezvous store (a channel beside the messages)",
    "_getframe": "the interpreter's frames",
    "f_back": "the interpreter's frames", "f_globals": "the interpreter's frames",
    "f_locals": "the interpreter's frames", "f_builtins": "the interpreter's frames",
    "f_code": "the interpreter's frames", "tb_frame": "the interpreter's frames",
    "gi_frame": "the interpreter's frames", "cr_frame": "the interpreter's frames",
    "co_code": "code objects", "co_consts": "code objects", "co_names": "code objects",
    "CodeType": "code objects", "FunctionType": "code objects", "CellType": "closure cells",
    "cell_contents": "closure cells (another function's variables)",
    "from_file": "file I/O", "tofile": "file I/O",
}
# Modules reached as an attribute of another (torch.os, numpy.sys): never needed.
MODULE_ATTRIBUTES = frozenset({"os", "sys", "subprocess", "builtins", "importlib", "ctypes", "socket", "pickle",
                               "io", "gc", "inspect", "shutil", "glob", "pathlib", "signal", "threading",
                               "multiprocessing", "mmap", "marshal", "tempfile"})
# Dunder attributes an honest solution uses (super().__init__, a class's name in a message).
FINE_DUNDERS = frozenset({"__init__", "__name__", "__qualname__", "__class__", "__len__", "__iter__", "__getitem__",
                          "__next__", "__enter__", "__exit__", "__call__", "__post_init__", "__repr__", "__str__",
                          "__future__", "__all__"})
# Methods that make a value lie about itself or run code when it is unpickled or compared.
TRICK_METHODS = frozenset({"__reduce__", "__reduce_ex__", "__getstate__", "__setstate__", "__getattr__",
                           "__getattribute__", "__setattr__", "__delattr__", "__del__", "__eq__", "__ne__",
                           "__hash__", "__bool__", "__float__", "__int__", "__index__", "__array__",
                           "__torch_function__", "__torch_dispatch__", "__instancecheck__", "__subclasscheck__",
                           "__init_subclass__", "__class_getitem__"})
VALUE_TYPES = frozenset({"float", "int", "complex", "str", "bytes", "tuple", "list", "dict", "set", "frozenset",
                         "bool", "ndarray", "Tensor", "Parameter"})
BUILTIN_CALLS = {"open": "opens a file", "exec": "exec()", "eval": "eval()", "compile": "compile()",
                 "__import__": "__import__()", "globals": "globals()", "locals": "locals()", "vars": "vars()",
                 "breakpoint": "breakpoint()", "input": "input()", "memoryview": "memoryview()",
                 "dir": "dir() (looks for names the file does not spell out)"}
NAME_CHECKS = frozenset({"getattr", "setattr", "delattr", "hasattr"})
# Dotted names (after resolving import aliases) that do file I/O or load foreign code.
DOTTED = {
    "torch.save": "file I/O (torch.save)", "torch.load": "file I/O (torch.load)",
    "torch.ops": "torch's operator registry", "torch.classes": "torch's class registry",
    "torch.library": "torch's operator library", "torch.utils.cpp_extension": "C++ extensions (compiled code)",
    "torch.hub": "torch.hub", "torch.multiprocessing": "torch.multiprocessing",
    "torch.distributed.rpc": "torch.distributed.rpc (a channel beside the messages)",
    "numpy.save": "file I/O (numpy)", "numpy.savez": "file I/O (numpy)", "numpy.savetxt": "file I/O (numpy)",
    "numpy.load": "file I/O (numpy)", "numpy.loadtxt": "file I/O (numpy)", "numpy.fromfile": "file I/O (numpy)",
    "numpy.genfromtxt": "file I/O (numpy)", "numpy.memmap": "file I/O (numpy)", "numpy.ctypeslib": "numpy.ctypeslib",
    "numpy.lib": "numpy.lib (file formats)", "numpy.DataSource": "file I/O (numpy)",
    "torch.jit.load": "file I/O (torch.jit.load)", "torch.jit.save": "file I/O (torch.jit.save)",
    "torch.from_file": "file I/O (torch.from_file)", "torch.serialization": "torch.serialization (file I/O)",
    "torch.UntypedStorage.from_file": "file I/O (a storage from a file)",
}
# fmt: on


def _resolve(dotted: str):
    """The object ``dotted`` names, looked up in the modules the grader has already imported (never
    importing one, never running a module's ``__getattr__``), or None."""
    import inspect
    import sys

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is None:
            continue
        value = module
        for attr in parts[cut:]:
            try:
                value = inspect.getattr_static(value, attr)
            except AttributeError:
                return None
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
        return value
    return None


# Other spellings of DOTTED names, known without importing anything (the grader, which has torch and numpy
# imported, also resolves every name to its object: :func:`flagged_objects`).
ALIASES = {
    "torch.serialization.save": "torch.save",
    "torch.serialization.load": "torch.load",
    "numpy.lib.npyio.load": "numpy.load",
    "numpy.lib.npyio.save": "numpy.save",
}
_FLAGGED_OBJECTS: dict = {}


def flagged_objects() -> dict:
    """{id(object): (object, reason)} of every :data:`DOTTED` name that resolves here: an alias of one
    (``torch.serialization.load`` is ``torch.load``) is the same object, whatever its spelling, so
    a Lab 02 that moves its data through ``torch.serialization.save/load`` cannot score points unflagged."""
    if not _FLAGGED_OBJECTS:
        for name, reason in DOTTED.items():
            value = _resolve(name)
            if value is not None and not isinstance(value, (int, float, str, bool, type(None))):
                _FLAGGED_OBJECTS[id(value)] = (value, reason)
        _FLAGGED_OBJECTS[0] = (None, "")  # (computed once, even where nothing resolves)
    return _FLAGGED_OBJECTS


# What a lab's README asks for that is flagged elsewhere: Lab 12's traffic meter replaces dist.all_reduce,
# dist.send and dist.isend with counting wrappers (getattr and setattr on torch.distributed, by name).
# fmt: off
LAB_ALLOWS = {"lab-12-the-whole-bill": {"replaces": {"torch.distributed.all_reduce", "torch.distributed.send",
                                                     "torch.distributed.isend"},
                                        "names_on": {"torch.distributed"}}}
# Labs that ask for point-to-point messages only: a built-in collective there is the lab's answer skipped.
POINT_TO_POINT_ONLY = frozenset({"lab-02-ring-allreduce", "lab-07-pipeline-schedules", "lab-10-moe-all-to-all"})
COLLECTIVES = frozenset({"all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
                         "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "reduce", "all_to_all",
                         "all_to_all_single", "gather", "gather_object", "scatter", "scatter_object_list"})
COMMUNICATION = COLLECTIVES | {"send", "recv", "isend", "irecv"}
# Calls that start a process, make a descriptor or decode hidden code, whatever they are reached through
# (a submission once reached os as ``random._os`` and ran a helper from a hex string): never a lab's.
PROCESS_CALLS = {**{name: "starts a process" for name in (
    "fork", "forkpty", "execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp", "execlpe",
    "posix_spawn", "posix_spawnp", "spawnv", "spawnve", "spawnvp", "spawnvpe", "spawnl", "spawnle", "popen",
    "Popen", "system")},
    **{name: "makes a file descriptor" for name in ("pipe", "pipe2", "dup", "dup2", "mkfifo", "socketpair",
                                                     "memfd_create", "fdopen")},
    **{name: "decodes text into bytes (code or data kept out of sight?)" for name in (
        "fromhex", "unhexlify", "a2b_hex", "b64decode", "b32decode", "b85decode", "a85decode",
        "decodebytes", "decompress")}}
ENCODED_LENGTH = 200   # a string this long of only hex or base64 characters holds something to decode
_ENCODED = frozenset("0123456789abcdefABCDEF") | frozenset("ghijklmnopqrstuvwxyzGHIJKLMNOPQRSTUVWXYZ+/=-_")
CONSTANT_TENSORS = frozenset({"zeros", "zeros_like", "ones", "ones_like", "empty", "empty_like", "full", "full_like"})
# Places on the machine or the grader's own files, named in a string.
PLACES = ("/proc", "/tmp", "/dev/", "/run/", "/var/", "/sys/", "/etc/", "/home", "/root", "/usr", "site-packages",
          "/hidden", "test_lab.py", "solution.py", "starter.py", "commtax-grading", "commtax/", "grading/")
MODULE_NAMES_IN_STRINGS = ("commtax.", "grading.", "_pytest", "pytest")
_BIDI = {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C)}
# fmt: on


def allowed_imports(shipped_starter: bytes | str | None) -> frozenset:
    """What a lab's learner may import: :data:`ALLOWED_MODULES` and every module the lab's shipped starter
    (``shipped_starter``, its text) imports (Lab 12's given helpers in ``commtax.ranks.wholebill``, say)."""
    extra = set()
    try:
        tree = ast.parse(shipped_starter or "")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        tree = ast.Module(body=[], type_ignores=[])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            extra.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            extra.add(node.module)
    return ALLOWED_MODULES | extra


def scan(source: bytes | str, lab: str = "", allowed: frozenset = ALLOWED_MODULES) -> list[str]:
    """The flags of one learner file, in line order: ``"line N: reason"``; the last says how many were left
    out when there were more than :data:`KEPT`. An empty list: nothing an honest solution does not do."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [f"line {exc.lineno or 0}: the file does not parse ({exc.msg}): it cannot have been run as written"]
    except (ValueError, RecursionError, MemoryError) as exc:  # NUL bytes; nesting deeper than the parser goes
        why = "nested too deeply" if isinstance(exc, RecursionError) else type(exc).__name__
        return [f"line 0: the file could not be parsed ({why})"]
    found = _Scan(tree, lab, allowed).run()
    if isinstance(source, bytes):
        source = source.decode("utf-8", "replace")
    if any(ch in _BIDI for ch in source):
        found.append((1, "bidirectional control characters in the source (text shown in another order than run)"))
    lines = [f"line {line}: {reason}" for line, reason in sorted(set(found))]
    return lines[:KEPT] + ([f"... and {len(lines) - KEPT} more"] if len(lines) > KEPT else [])


class _Scan:
    """One walk over the tree, collecting (line, reason)."""

    def __init__(self, tree: ast.Module, lab: str, allowed: frozenset):
        self.tree, self.lab, self.allowed = tree, lab, allowed
        self.found: list = []
        self.modules: dict = {}  # local name -> the module it is bound to by an import
        self.allows = LAB_ALLOWS.get(lab, {})
        self.nodes, self.complete = _nodes(tree, NODE_LIMIT)  # [(node, the function or module it is in)]
        self.literal_names = _literal_loop_names(self.nodes)  # per scope: loop variable -> the strings it takes
        self.scope = tree
        self.named: set = set()  # the string constants getattr() and the like were given
        self.docstrings = {
            id(node.body[0].value)
            for node, _ in self.nodes
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }

    def flag(self, node, reason: str) -> None:
        self.found.append((getattr(node, "lineno", 0), reason))

    def run(self) -> list:
        self._module_level()
        imports = [n for n, _ in self.nodes if isinstance(n, (ast.Import, ast.ImportFrom))]
        done = {id(n) for n in imports}
        for node in imports:  # first: a name used above its import (in a function) is still known
            getattr(self, f"_{type(node).__name__}")(node)
        for node, scope in self.nodes:
            check = None if id(node) in done else getattr(self, f"_{type(node).__name__}", None)
            if check is not None:
                self.scope = scope
                check(node)
        if not self.complete:
            self.flag(
                self.nodes[-1][0], f"the file is too large to scan past {NODE_LIMIT:,} syntax nodes: read the rest"
            )
        return self.found

    # -- the module's own statements ------------------------------------------------------------

    def _module_level(self) -> None:
        defined: dict = {}
        for stmt in self.tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if stmt.name in defined:
                    self.flag(
                        stmt,
                        f"defines {stmt.name} again (first at line {defined[stmt.name]}): the later one replaces it",
                    )
                defined.setdefault(stmt.name, stmt.lineno)
            elif isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Pass)):
                continue
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue  # the docstring (or another string: it runs nothing)
            elif isinstance(stmt, ast.If) and _is_main_guard(stmt.test):
                continue
            else:
                self.flag(stmt, f"runs code when the module is imported ({_statement(stmt)})")

    # -- imports --------------------------------------------------------------------------------

    def _Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._module(node, alias.name)
            if alias.asname:
                self.modules[alias.asname] = alias.name
            else:
                self.modules[alias.name.split(".")[0]] = alias.name.split(".")[0]

    def _ImportFrom(self, node: ast.ImportFrom) -> None:
        module = "." * node.level + (node.module or "")
        self._module(node, module)
        for alias in node.names:
            self._name(node, alias.name)
            if alias.name != "*":
                self.modules[alias.asname or alias.name] = f"{module}.{alias.name}"
                self._object(node, f"{module}.{alias.name}")

    def _object(self, node, dotted: str) -> None:
        """Flag ``dotted`` if it is, under another name, an object :data:`DOTTED` flags."""
        if dotted.startswith("."):
            return
        if dotted in ALIASES:  # (known without torch imported: a scan outside the grader)
            self.flag(node, f"{DOTTED[ALIASES[dotted]]}, as {_shown(dotted)}")
            return
        value = _resolve(dotted)
        if value is None:
            return
        known = flagged_objects().get(id(value))
        if known is not None and known[0] is value:
            self.flag(node, f"{known[1]}, as {_shown(dotted)}")

    def _module(self, node, module: str) -> None:
        if module not in self.allowed:
            self.flag(node, f"imports {_shown(module)} (not needed by this lab)")

    # -- names and attributes -------------------------------------------------------------------

    def _name(self, node, name: str) -> None:
        if name in INTERNAL_NAMES:
            self.flag(node, f"{_shown(name)}: {INTERNAL_NAMES[name]}")
        elif _dunder(name) and name not in FINE_DUNDERS:
            self.flag(node, f"{_shown(name)} (an interpreter internal)")
        elif name in MODULE_ATTRIBUTES and not isinstance(node, (ast.Import, ast.ImportFrom)):
            self.flag(node, f".{name}: the {name} module reached through another")
        elif name.startswith("_") and not _dunder(name) and isinstance(node, ast.ImportFrom):
            self.flag(node, f"imports the private name {_shown(name)}")

    def _Name(self, node: ast.Name) -> None:
        if _dunder(node.id) and node.id not in FINE_DUNDERS:
            self.flag(node, f"{_shown(node.id)} (an interpreter internal)")
        elif node.id in INTERNAL_NAMES:
            self.flag(node, f"{_shown(node.id)}: {INTERNAL_NAMES[node.id]}")

    def _Attribute(self, node: ast.Attribute) -> None:
        self._name(node, node.attr)
        dotted = self._dotted(node)
        if dotted is None:
            return
        if node.attr.startswith("_") and not _dunder(node.attr):  # of any module: random._os is os
            self.flag(node, f"the private name {_shown(dotted)}")
        for name, reason in DOTTED.items():
            if dotted == name:
                self.flag(node, reason)
                break
        else:
            self._object(node, dotted)
        if isinstance(node.ctx, (ast.Store, ast.Del)) and dotted not in self.allows.get("replaces", ()):
            self.flag(node, f"replaces {_shown(dotted)} (changes a module for everything that uses it)")

    def _dotted(self, node) -> str | None:
        """``dist.send`` -> ``torch.distributed.send`` when the chain starts at a name bound to a module."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in self.modules:
            return None
        return ".".join([self.modules[node.id], *reversed(parts)])

    # -- calls ----------------------------------------------------------------------------------

    def _Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in BUILTIN_CALLS:
            self.flag(node, BUILTIN_CALLS[func.id])
        if isinstance(func, ast.Name) and func.id in NAME_CHECKS and len(node.args) >= 2:
            name, owner = node.args[1], node.args[0]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                self._name(node, name.value)
                self.named.add(id(name))  # (not flagged again as a string)
                module = self._dotted(owner) if isinstance(owner, (ast.Name, ast.Attribute)) else None
                replaced = f"{module}.{name.value}"
                if func.id in ("setattr", "delattr") and module and replaced not in self.allows.get("replaces", ()):
                    self.flag(node, f"replaces {_shown(replaced)} (changes a module for everything that uses it)")
            elif isinstance(name, ast.Name) and name.id in self.literal_names.get(id(self.scope), {}):
                for value in self.literal_names[id(self.scope)][name.id]:  # for name in ("a", "b"): getattr(x, name)
                    self._name(node, value)
            elif not (isinstance(owner, ast.Name) and self.modules.get(owner.id) in self.allows.get("names_on", ())):
                self.flag(node, f"{func.id}() with a computed name (which attribute cannot be read from the file)")
        if (
            isinstance(func, ast.Attribute)
            and func.attr in PROCESS_CALLS
            and not (isinstance(func.value, ast.Name) and func.value.id == "self")
        ):
            self.flag(node, f".{func.attr}(): {PROCESS_CALLS[func.attr]}")
        dotted = self._dotted(func) if isinstance(func, ast.Attribute) else None
        if dotted and dotted.startswith("torch.distributed."):
            self._communication(node, dotted.rsplit(".", 1)[1])

    def _communication(self, node: ast.Call, name: str) -> None:
        if name in COLLECTIVES and self.lab in POINT_TO_POINT_ONLY:
            self.flag(node, f"calls dist.{name} (this lab asks for point-to-point messages only)")
        if name in COMMUNICATION and any(self._constant_tensor(arg) for arg in node.args[:2]):
            self.flag(
                node,
                f"dist.{name} of a tensor made in the call (a payload that carries nothing, or a result thrown away)",
            )

    def _constant_tensor(self, node) -> bool:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            return False
        dotted = self._dotted(node.func)
        return bool(dotted) and dotted.startswith("torch.") and dotted.rsplit(".", 1)[1] in CONSTANT_TENSORS

    # -- definitions ----------------------------------------------------------------------------

    def _ClassDef(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
            if name in VALUE_TYPES:
                self.flag(node, f"class {_shown(node.name)} is a kind of {name} (a value that may lie about itself)")
        for stmt in node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name in TRICK_METHODS:
                self.flag(stmt, f"defines {stmt.name} (changes how a value compares, converts or unpickles)")

    # -- strings --------------------------------------------------------------------------------

    def _Constant(self, node: ast.Constant) -> None:
        value = node.value
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        if not isinstance(value, str) or id(node) in self.docstrings:
            return
        places = [p for p in PLACES if p in value]
        if places:
            self.flag(node, f"a string naming {', '.join(places[:3])}")
        modules = [m for m in MODULE_NAMES_IN_STRINGS if m in value]
        if modules:
            self.flag(node, f"a string naming {modules[0].rstrip('.')} modules")
        if id(node) not in self.named and (value in INTERNAL_NAMES or (_dunder(value) and value not in FINE_DUNDERS)):
            self.flag(node, f"the string {_shown(value)} (an internal name)")
        if any(_control(ch) for ch in value):
            self.flag(node, "a string with control characters, escapes or lone surrogates")
        if len(value) >= ENCODED_LENGTH and set(value) <= _ENCODED:
            self.flag(node, f"a string of {len(value):,} hex or base64 characters (encoded code or data?)")


def _nodes(tree, limit: int) -> tuple[list, bool]:
    """([(node, the innermost function or module holding it)], whether every node is there): one walk,
    no recursion (a learner's file may nest as deep as the parser allows), at most ``limit`` nodes."""
    found, stack = [], [(tree, tree)]
    while stack:
        if len(found) >= limit:
            return found, False
        node, scope = stack.pop()
        found.append((node, scope))
        inner = node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else scope
        stack.extend((child, inner) for child in ast.iter_child_nodes(node))
    return found, True


def _literal_loop_names(nodes: list) -> dict:
    """{id of a scope: {name: the strings it takes}}: in each function (or the module), the variables bound
    only by ``for name in ("a", "b", ...)`` loops, so that ``getattr(plan, name)`` there reads only those."""
    literal, targets, other = {}, set(), {}
    for node, scope in nodes:
        if isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name):
            items = node.iter.elts if isinstance(node.iter, (ast.Tuple, ast.List, ast.Set)) else None
            if items and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in items):
                literal.setdefault(id(scope), {}).setdefault(node.target.id, set()).update(e.value for e in items)
                targets.add(id(node.target))
    for node, scope in nodes:
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and id(node) not in targets:
            other.setdefault(id(scope), set()).add(node.id)
        elif isinstance(node, ast.arguments):  # a function's own arguments are in its scope
            other.setdefault(id(scope), set()).update(a.arg for a in ast.walk(node) if isinstance(a, ast.arg))
    return {
        scope: {name: values for name, values in names.items() if name not in other.get(scope, ())}
        for scope, names in literal.items()
    }


def _statement(stmt) -> str:
    kinds = {
        ast.For: "a for loop",
        ast.AsyncFor: "a for loop",
        ast.While: "a while loop",
        ast.If: "an if statement",
        ast.Try: "a try statement",
        ast.With: "a with statement",
        ast.Expr: "a call",
        ast.Delete: "a del",
        ast.Global: "a global statement",
        ast.Raise: "a raise",
        ast.Assert: "an assert",
    }
    return kinds.get(type(stmt), f"a {type(stmt).__name__.lower()} statement")


def _dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _is_main_guard(test) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and len(test.comparators) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "__main__"
    )


def _control(ch: str) -> bool:
    return ch not in "\n\t" and (ch in _BIDI or unicodedata.category(ch) in ("Cc", "Cs"))


def _shown(name: str) -> str:
    """A learner's name as the teacher's report shows it: printable, at most 60 characters."""
    name = "".join(ch if ch.isprintable() else "?" for ch in name)
    return name if len(name) <= 60 else name[:57] + "..."
