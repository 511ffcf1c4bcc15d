"""Kernel templates in a split build (`cusplit`): which instantiations a launch needs, and the `.cu` code that
makes them linkable from main.cpp.

A launch's template arguments (or the types an `AT_DISPATCH_*` macro in the table instantiates) are exactly
what the plain build instantiates; each is exported through an explicitly instantiated host function template
returning the kernel stub's address. Unknown macros decline.
Rationale: docs/design/builder.md#cutemplates
"""
from __future__ import annotations

import re

DISPATCH = re.compile(r"\bAT_DISPATCH_(\w+?)\s*\(")
SCALAR_T = re.compile(r"\bscalar_t\b")
_INTEGRAL = ["uint8_t", "int8_t", "int16_t", "int32_t", "int64_t"]
_DISPATCH_TYPES = {  # ATen/Dispatch.h: the types each macro instantiates its lambda for
    "FLOATING_TYPES": ["double", "float"], "FLOATING_TYPES_AND_HALF": ["double", "float", "c10::Half"],
    "REDUCED_FLOATING_TYPES": ["c10::Half", "c10::BFloat16"], "INTEGRAL_TYPES": _INTEGRAL,
    "ALL_TYPES": _INTEGRAL + ["double", "float"]}
_SCALAR_TYPE = {"Half": "c10::Half", "BFloat16": "c10::BFloat16", "Bool": "bool", "Float": "float",
                "Double": "double", "Int": "int32_t", "Long": "int64_t", "Short": "int16_t", "Char": "int8_t",
                "Byte": "uint8_t"}


def past_close(text: str, i: int, pair: str = "()") -> int:
    """The index just past the bracket closing the one opened before `i` (`len(text)` if it never closes)."""
    depth = 1
    while i < len(text) and depth:
        depth += {pair[0]: 1, pair[1]: -1}.get(text[i], 0)
        i += 1
    return i


def dispatch_types(mtext: str, at: int) -> list[str] | None:
    """The types `scalar_t` takes at position `at`: those of the innermost AT_DISPATCH macro call around it."""
    best = None
    for m in DISPATCH.finditer(mtext, 0, at):
        if past_close(mtext, m.end()) > at:
            best = m
    if best is None:
        return None
    kind = best.group(1)
    extra = re.fullmatch(r"(\w+?)_AND(\d?)", kind)
    if kind in _DISPATCH_TYPES:
        return list(_DISPATCH_TYPES[kind])
    if not extra or extra.group(1) not in _DISPATCH_TYPES or kind.endswith("_AND_HALF"):
        return None  # complex types, AT_DISPATCH_SWITCH and the like
    n = int(extra.group(2) or 1)
    args = split_args(mtext[best.end():])[:n]
    names = [re.search(r"(\w+)\s*$", a) for a in args]
    added = [_SCALAR_TYPE.get(re.sub(r"^k", "", x.group(1))) if x else None for x in names]
    if len(added) != n or None in added:
        return None
    return _DISPATCH_TYPES[extra.group(1)] + added


def split_args(text: str) -> list[str]:
    """The comma-separated arguments of a call whose `(` was just consumed (up to its `)`)."""
    args, depth, cur = [], 0, []
    for c in text:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                break
            depth -= 1
        if c == "," and depth == 0:
            args.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
    args.append("".join(cur).strip())
    return args


def instantiations(templates: dict, instances: list) -> str:
    """The end of the split .cu. nvcc gives the host stubs of template kernels internal linkage, so main.cpp
    cannot name `k<float>` itself: per kernel template an ordinary host function template returns the
    stub's address (taking it instantiates the kernel, device code and stub, as a launch here would), and
    is explicitly instantiated for each launch of main.cpp (ordinary external symbols)."""
    out = ["\n// kernelcraft split build: the kernel template instantiations main.cpp launches"]
    for name, tpl in templates.items():
        params = ", ".join(template_param_names(tpl))
        out.append(f"{tpl} void* kc_split_addr_{name}() {{ return (void*)&{name}<{params}>; }}")
        out += [f"template void* kc_split_addr_{name}{targs}();" for n, targs in instances if n == name]
    return "\n".join(out) + "\n"


def template_param_names(tpl: str) -> list[str] | None:
    """The parameter names of `template <...>`, in order; None for unnamed ones, packs and template templates."""
    inner = tpl[tpl.index("<") + 1:tpl.rindex(">")]
    names = []
    for p in split_args(inner + ")"):
        p = p.split("=")[0].strip()
        m = re.fullmatch(r"(?:typename|class|[\w:]+(?:\s+[\w:]+)*)\s+(\w+)", p)
        if not m or "..." in p:
            return None  # unnamed parameters, packs, template template parameters
        names.append(m.group(1))
    return names
