"""Static screen: read a candidate's AST before anything runs, reject known cheats, find its kernels.

Runs in the caller on source text only, one layer of two: every rule has a runtime twin in the candidate's process
or the judge. Rules name constructs, not intentions; a value is read only where that settles the question (a flag
set to its default, an attribute this torch lacks, a false `hasattr` branch), and a value it cannot read counts as
a change. Strict mode adds reachability from `ModelNew` (`reference_call`, `no_custom_kernel`).

Rationale: docs/design/judge-caller.md#screen
"""
from __future__ import annotations

import ast
import re
import types
from dataclasses import dataclass, field

FRAME_ATTRS = {"_getframe", "f_back", "f_locals", "f_globals", "tb_frame", "gi_frame", "cr_frame",
               "ag_frame", "currentframe", "getouterframes", "getinnerframes", "get_referrers",
               "get_referents", "get_objects", "_current_frames"}
PROCESS_MODULES = {"threading", "_thread", "multiprocessing", "concurrent", "subprocess", "pty", "signal"}
PROCESS_CALLS = {"fork", "forkpty", "system", "popen", "spawnl", "spawnv", "spawnlp", "spawnvp",
                 "posix_spawn", "execv", "execl", "execvp", "kill"}
HOOK_ATTRS = {"setprofile", "settrace", "monitoring", "setprofile_all_threads", "settrace_all_threads"}
CLOCK_ROOTS = {"time", "torch.cuda", "timeit"}
STATE_CALLS = {"torch.set_num_threads", "torch.set_num_interop_threads", "torch.set_default_dtype",
               "torch.set_default_tensor_type", "torch.set_float32_matmul_precision",
               "torch.use_deterministic_algorithms", "torch.set_default_device",
               "torch.backends.cuda.matmul.allow_tf32", "torch.set_flush_denormal",
               "torch.backends.cuda.enable_flash_sdp", "torch.backends.cuda.enable_mem_efficient_sdp",
               "torch.backends.cuda.enable_math_sdp", "torch.backends.cuda.enable_cudnn_sdp",
               "torch._C._set_torch_function_mode", "torch._C._push_on_torch_function_stack",
               "torch._C._push_on_torch_dispatch_stack"}
# introspection that reaches the reference or other functions' insides
INTROSPECTION_ATTRS = {"__code__", "__closure__", "cell_contents", "__globals__", "__subclasses__", "__wrapped__"}
ALLOWED_TORCH_ASSIGN = ("torch.backends.cudnn.benchmark", "torch.backends.cudnn.deterministic", "torch._dynamo.config",
                        "torch._inductor.config")
# torch's defaults (tests/test_screen.py checks them against a fresh interpreter): setting one is no change
FLAG_DEFAULTS = {
    "torch.backends.cudnn.benchmark": False, "torch.backends.cudnn.deterministic": False,
    "torch.backends.cudnn.allow_tf32": True, "torch.backends.cudnn.enabled": True,
    "torch.backends.cuda.matmul.allow_tf32": False,
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": True,
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": True,
    "torch.backends.mkldnn.enabled": True,
}
# setter -> (its default argument, the getter that reads it back)
CALL_DEFAULTS = {
    "torch.set_float32_matmul_precision": ("highest", "torch.get_float32_matmul_precision"),
    "torch.use_deterministic_algorithms": (False, "torch.are_deterministic_algorithms_enabled"),
    "torch.backends.cuda.enable_flash_sdp": (True, "torch.backends.cuda.flash_sdp_enabled"),
    "torch.backends.cuda.enable_mem_efficient_sdp": (True, "torch.backends.cuda.mem_efficient_sdp_enabled"),
    "torch.backends.cuda.enable_math_sdp": (True, "torch.backends.cuda.math_sdp_enabled"),
}
_GLOBAL_RE = re.compile(r"\b__global__\b")
_LAUNCH_BOUNDS_RE = re.compile(r"__launch_bounds__\s*\((?:[^()]|\([^()]*\))*\)")
_DECL_NAME_RE = re.compile(r"[^(;{}]*?(\w+)\s*\(", re.S)


def cuda_kernel_names(source: str) -> list[str]:
    """Names of `__global__` functions, whatever sits between `__global__` and the name: `void`, a
    `__launch_bounds__(...)` before or after it, `static`, `extern "C"`, a templated return type."""
    names: list[str] = []
    for m in _GLOBAL_RE.finditer(source):
        decl = _LAUNCH_BOUNDS_RE.sub(" ", source[m.end():m.end() + 600])
        d = _DECL_NAME_RE.match(decl)
        if d and d.group(1) not in names:
            names.append(d.group(1))
    return names


@dataclass
class Screening:
    findings: list[tuple[str, str]] = field(default_factory=list)  # (reason, message)
    kernel_names: list[str] = field(default_factory=list)
    has_inline_ext: bool = False
    has_triton: bool = False

    @property
    def reasons(self) -> list[str]:
        return sorted({r for r, _ in self.findings})

    def add(self, reason: str, node: ast.AST | None, what: str) -> None:
        line = f" (line {node.lineno})" if node is not None and hasattr(node, "lineno") else ""
        self.findings.append((reason, what + line))


class _Aliases(ast.NodeVisitor):
    """Local name -> dotted module path, from the module's imports."""

    def __init__(self):
        self.map: dict[str, str] = {}

    def visit_Import(self, node):
        for a in node.names:
            self.map[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]

    def visit_ImportFrom(self, node):
        if node.module and not node.level:
            for a in node.names:
                self.map[a.asname or a.name] = f"{node.module}.{a.name}"


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root + ".")


def screen(source: str, mode: str = "open") -> Screening:
    tree = ast.parse(source)
    al = _Aliases()
    al.visit(tree)
    aliases = al.map
    s = Screening(kernel_names=cuda_kernel_names(source))
    dead = _dead_code(tree, aliases)
    for node in ast.walk(tree):
        if id(node) in dead:
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for m in mods:
                top = m.split(".")[0]
                if top == "kernelcraft" or m.startswith("kernelcraft_"):
                    s.add("forbidden_construct", node, f"imports the harness ({m})")
                elif top in PROCESS_MODULES:
                    s.add("thread_injection", node, f"imports {m}: threads and processes are not allowed")
                elif top == "gc":
                    s.add("forbidden_construct", node, "imports gc (walking the harness's objects)")
                elif top in ("importlib", "builtins"):
                    s.add("forbidden_construct", node, f"imports {m} (imports by computed name)")
        elif isinstance(node, ast.Attribute):
            if node.attr in INTROSPECTION_ATTRS:
                s.add("forbidden_construct", node, f"uses .{node.attr} (reaching into other code)")
            elif node.attr in FRAME_ATTRS:
                s.add("forbidden_construct", node, f"uses .{node.attr} (inspecting the harness's frames)")
            elif node.attr in HOOK_ATTRS and _dotted(node.value, aliases) in ("sys", "threading"):
                s.add("global_state_tampering", node, f"uses {_dotted(node.value, aliases)}.{node.attr} "
                      "(interpreter hooks run code inside the harness)")
            elif node.attr == "modules" and _dotted(node.value, aliases) == "sys":
                s.add("forbidden_construct", node, "uses sys.modules (reaching the harness's modules)")
            elif node.attr in PROCESS_CALLS and _dotted(node.value, aliases) == "os":
                s.add("thread_injection", node, f"calls os.{node.attr}")
        elif isinstance(node, ast.Name) and node.id in ("__builtins__", "__import__"):
            s.add("forbidden_construct", node, f"uses {node.id}")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            for t in targets:
                _check_store(s, t, aliases, value)
        elif isinstance(node, ast.Call):
            fn = _dotted(node.func, aliases)
            if fn in STATE_CALLS and not _default_call(fn, node):
                s.add("global_state_tampering", node, f"calls {fn}() (process-wide setting)")
            elif fn in ("setattr", "delattr") and node.args:
                target = _dotted(node.args[0], aliases)
                if target and not any(_under(target, a) for a in ALLOWED_TORCH_ASSIGN) and (
                        _under(target, "torch") or any(_under(target, r) for r in CLOCK_ROOTS)
                        or _module_rooted(node.args[0], aliases)):
                    code = "timer_tampering" if any(_under(target, r) for r in CLOCK_ROOTS) else \
                        "global_state_tampering"
                    s.add(code, node, f"{fn}() on {target}")
            elif fn and fn.split(".")[-1] in ("load_inline", "load") and "cpp_extension" in fn:
                s.has_inline_ext = True
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list:
                dn = _dotted(d.func if isinstance(d, ast.Call) else d, aliases) or ""
                if dn.startswith("triton.") and dn.split(".")[-1] in ("jit", "autotune", "heuristics"):
                    s.has_triton = True
                    if node.name not in s.kernel_names:
                        s.kernel_names.append(node.name)
    if mode == "strict":
        _strict(s, tree, aliases)
    return s


def _check_store(s: Screening, target: ast.AST, aliases: dict[str, str], value: ast.AST | None = None) -> None:
    if isinstance(target, (ast.Tuple, ast.List)):
        values = value.elts if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts) \
            else [None] * len(target.elts)
        for t, v in zip(target.elts, values):
            _check_store(s, t, aliases, v)
        return
    if not isinstance(target, ast.Attribute):
        return
    path = _dotted(target, aliases)
    if not path:
        return
    if any(_under(path, r) for r in CLOCK_ROOTS):
        s.add("timer_tampering", target, f"assigns {path}")
    elif any(_under(path, a) for a in ALLOWED_TORCH_ASSIGN):
        return
    elif _under(path, "torch") and (_is_default(path, value) or _undefined_in_torch(path)):
        return  # no change: the value it has by default, or an attribute torch does not define (and never reads)
    elif _under(path, "torch"):
        s.add("global_state_tampering", target, f"assigns {path}")
    elif _module_rooted(target, aliases):
        s.add("global_state_tampering", target, f"assigns {path} (patching an imported module)")


def _is_default(path: str, value: ast.AST | None) -> bool:
    return (path in FLAG_DEFAULTS and isinstance(value, ast.Constant)
            and type(value.value) is type(FLAG_DEFAULTS[path]) and value.value == FLAG_DEFAULTS[path])


def _default_call(fn: str, node: ast.Call) -> bool:
    """A setter called with its default as its one argument (`torch.set_float32_matmul_precision("highest")`)."""
    if fn not in CALL_DEFAULTS or node.keywords or len(node.args) != 1 or not isinstance(node.args[0], ast.Constant):
        return False
    default, arg = CALL_DEFAULTS[fn][0], node.args[0].value
    return type(arg) is type(default) and arg == default


_MISSING = object()


def _torch_object(path: str):
    """The object a dotted torch path names in this process's torch, or _MISSING (imports torch on first use)."""
    import importlib

    parts = path.split(".")
    try:
        obj = importlib.import_module(parts[0])
    except ImportError:
        return _MISSING
    for name in parts[1:]:
        try:
            obj = getattr(obj, name)
        except Exception:  # noqa: BLE001 - absent, or failing lazily: not an attribute anyone can use
            return _MISSING
    return obj


def _undefined_in_torch(path: str) -> bool:
    """`torch.x.y.name` where `torch.x.y` is a module of this torch that has no `name` (not a dunder): an
    assignment there creates an attribute nothing in torch reads. Classes are not exempt (lookups go through
    them and their subclasses)."""
    parent, _, name = path.rpartition(".")
    if not parent or name.startswith("__"):
        return False
    obj = _torch_object(parent)
    return isinstance(obj, types.ModuleType) and _torch_object(path) is _MISSING


def _hasattr_test(test: ast.AST, aliases: dict[str, str]) -> bool | None:
    """The value of `hasattr(torch..., "name")` (or its `not`) in this torch; None for any other test."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _hasattr_test(test.operand, aliases)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):  # one false conjunct makes it false
        return False if any(_hasattr_test(v, aliases) is False for v in test.values) else None
    if not (isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "hasattr"
            and len(test.args) == 2 and not test.keywords and isinstance(test.args[1], ast.Constant)
            and isinstance(test.args[1].value, str)):
        return None
    obj = _dotted(test.args[0], aliases)
    if not obj or not _under(obj, "torch"):
        return None
    base = _torch_object(obj)
    if base is _MISSING:
        return None
    return _torch_object(f"{obj}.{test.args[1].value}") is not _MISSING


def _binds(tree: ast.AST, name: str) -> bool:
    """Does the module bind `name` anywhere (assignment, def, class, import, argument, for/with/except target)?"""
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load):
            return True
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name:
            return True
        if isinstance(n, ast.alias) and (n.asname or n.name.split(".")[0]) == name:
            return True
        if isinstance(n, ast.arg) and n.arg == name:
            return True
        if isinstance(n, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and getattr(n, "name", None) == name:
            return True
        if isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names:
            return True
    return False


def _dead_code(tree: ast.AST, aliases: dict[str, str]) -> set[int]:
    """ids of the nodes in branches that cannot run in this torch: the body of an `if hasattr(torch..., "x")`
    that is false here, the `else` of one that is true. Only while the candidate never binds the name `hasattr`."""
    if _binds(tree, "hasattr"):
        return set()
    dead: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and id(node) not in dead:
            known = _hasattr_test(node.test, aliases)
            if known is None:
                continue
            for stmt in (node.orelse if known else node.body):
                dead.update(id(n) for n in ast.walk(stmt))
    return dead


def _module_rooted(node: ast.AST, aliases: dict[str, str]) -> bool:
    """An attribute chain on a name bound by an import (`json.dumps`, `encoder.c_make_encoder`): stores
    there patch a module the harness shares with the candidate (its serialisation, its clocks, ...)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id in aliases


def _strict(s: Screening, tree: ast.Module, aliases: dict[str, str]) -> None:
    """Reachability from ModelNew over top-level definitions."""
    defs: dict[str, list[ast.AST]] = {}
    ext_names, triton_names = set(), set(s.kernel_names)
    for node in tree.body:
        names = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            tg = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [n.id for t in tg for n in ast.walk(t) if isinstance(n, ast.Name)]
            if any(isinstance(c, ast.Call) and (_dotted(c.func, aliases) or "").endswith(("load_inline", ".load"))
                   for c in ast.walk(node)):
                ext_names.update(names)
        for n in names:
            defs.setdefault(n, []).append(node)
    seen, todo = set(), ["ModelNew"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in defs.get(name, []):
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name) and sub.id in defs:
                    todo.append(sub.id)
                if isinstance(sub, ast.Call) and (_dotted(sub.func, aliases) or "").endswith("load_inline"):
                    ext_names.add(name)
    reach_model = "Model" in seen or any(
        isinstance(n, ast.Name) and n.id == "Model" for d in defs.get("ModelNew", []) for n in ast.walk(d))
    if reach_model:
        s.add("reference_call", None, "ModelNew reaches the reference class Model")
    if not (seen & (ext_names | triton_names)):
        s.add("no_custom_kernel", None,
              "strict mode: ModelNew reaches no kernel of its own (load_inline extension or triton.jit)")
