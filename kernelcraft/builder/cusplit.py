"""Split a candidate's `.cu` into a torch-free `.cu` (kernels) and host code for main.cpp (the wrapper).

Top-level declarations are the unit, kept in their order; `<<<>>>` launches in host code become
`kc_split_launch` calls with the kernel's own parameter types. Anything this module cannot classify or does
not know is declined (None), never guessed; what a split gets wrong fails to build and falls back (`fastbuild`).
Rationale: docs/design/builder.md#cusplit
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from kernelcraft.builder import cutemplates

VERSION = 2  # bump when the split changes: it is part of the build cache key
# what a split .cu starts with: the CUDA runtime, as nvcc gives any .cu, and the standard headers torch's brings
# in a plain build, on which kernels lean without knowing (FLT_MAX, INT_MAX, std::min, fmaxf overloads, int64_t):
# a kernel that compiles in a plain build should not fail here for want of them (+0.2 s of nvcc)
PRELUDE = ["#include <cuda.h>", "#include <cuda_runtime.h>",
           "#include <cfloat>\n#include <climits>\n#include <cmath>\n#include <cstddef>\n#include <cstdint>\n"
           "#include <algorithm>"]
LAUNCHER = r"""
// kernelcraft split build: k<<<grid, block, shmem, stream>>>(args) as nvcc expands it (push the launch
// configuration, call the kernel's host stub, which nvcc defines in the .cu), with the kernel's own parameter
// types (see kernelcraft/builder/cusplit.py)
extern "C" unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
                                                struct CUstream_st* stream);
template <typename... P>
static inline auto kc_split_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t shmem = 0,
                                   cudaStream_t stream = 0) {
    return [=](P... args) { __cudaPushCallConfiguration(grid, block, shmem, stream) ? (void)0 : kernel(args...); };
}
"""
# what names torch (shared with fastbuild, whose `bare` test adds the include line to the names)
TORCH_NAMES = (r"\b(?:torch|at|c10|caffe2|py|pybind11)::|\bnamespace\s+(?:torch|at|c10|caffe2)\b|\b(?:ATen|Tensor)\b"
               r"|\b(?:TORCH|AT|C10|PYBIND11|THP)_\w+")
TORCH_INCLUDE = r'#\s*include\s*[<"](?:torch|ATen|c10|caffe2|pybind11|Python)'
_TORCH_INCLUDE = re.compile(TORCH_INCLUDE + r"\b")
_NAMES_TORCH = re.compile(TORCH_NAMES + r"|\bPy[A-Z]\w*")
_DECLINE_TEXT = re.compile(r"__CUDA_ARCH__|\bR\"|CUDA_API_PER_THREAD_DEFAULT_STREAM|\b__managed__\b|\b__constant__\b"
                           r"|cudaMemcpy(?:To|From)Symbol|cudaGetSymbolAddress")
_DECLINE_DIRECTIVE = re.compile(r"#\s*(?:if|ifdef|ifndef|elif|else|endif|line|error)\b")
_BAD_CUDA_FLAG = re.compile(r"^(?:-D|-U|-I|-Xcompiler|-Xcudafe|--compiler-options|--define-macro|--undefine-macro|--include-path"
                            r"|-include|--pre-include|-default-stream|--default-stream|-rdc|--relocatable-device-code"
                            r"|-dc\b|--device-c\b|-G\b|--device-debug)")
_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\s*\(")
_ATTRIBUTE = re.compile(r"__attribute__\s*\(\(")
_KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "decltype", "alignas", "static_assert"}


@dataclass
class Split:
    cuda: str  # the torch-free .cu (host-only chunks blanked, so line numbers stay the candidate's)
    host: str  # for main.cpp, after its first header set (`fastbuild`) and the candidate's cpp_sources
    kernels: list[str]


class _Decline(Exception):
    """Why a source is not split (a short reason, for `decline_reason` and the coverage benchmark)."""


def split(cuda_source: str, extra_cuda_cflags=None, templates: bool = False) -> Split | None:
    """The split of one `.cu` source, or None where this module declines (docs/design/builder.md#cusplit). Kernel
    templates only with `templates=True` (what builds pass unless `KERNELCRAFT_SPLIT=notemplates`)."""
    try:
        return _split(cuda_source, extra_cuda_cflags, templates)
    except _Decline:
        return None


def decline_reason(cuda_source: str, extra_cuda_cflags=None, templates: bool = False) -> str | None:
    """Why `split` declines this source; None where it splits it."""
    try:
        _split(cuda_source, extra_cuda_cflags, templates)
    except _Decline as d:
        return str(d)
    return None


def _split(cuda_source: str, extra_cuda_cflags, allow_templates: bool) -> Split:
    bad = [f for f in extra_cuda_cflags or [] if _BAD_CUDA_FLAG.match(str(f).strip())]
    if bad:
        raise _Decline(f"nvcc flag that reaches host code: {bad[0]}")
    masked = _mask(cuda_source)
    if masked is None:
        raise _Decline("unterminated comment or literal")
    for pattern, what in ((_DECLINE_TEXT, "declined construct"), (_DECLINE_DIRECTIVE, "preprocessor conditional")):
        m = pattern.search(masked)
        if m:
            raise _Decline(f"{what}: {m.group(0).strip()}")
    chunks = _chunks(cuda_source, masked)
    if chunks is None:
        raise _Decline("top level not made of complete declarations")
    kernels: dict[str, str] = {}  # name -> host declaration
    templates: dict[str, str] = {}  # kernel template name -> its `template <...>` line
    instances: list[tuple[str, str]] = []  # (`k`, `<float>`): the instantiations the host code launches
    placed = []  # (text, masked text, where, kernel declaration or None)
    for text, mtext in chunks:
        where = _classify(mtext)
        if where is None:
            raise _Decline(f"unclassifiable declaration: {' '.join(mtext.split())[:60]}")
        if where == "both" and _NAMES_TORCH.search(mtext):
            where = "host"  # a type or constant naming torch: the kernels cannot use it either
        decl = None
        if where == "kernel":
            header = mtext.split("{", 1)[0] if mtext.rstrip().endswith("}") else mtext.rstrip().rstrip(";")
            name = _function_name(header)
            if name is None:
                raise _Decline(f"kernel header not understood: {' '.join(header.split())[:60]}")
            if re.search(r"\bstatic\b", header):
                raise _Decline("static kernel")
            decl = _host_declaration(header) + ";"  # from the masked text: no comment can hide the `;`
            if re.match(r"\s*template\b", header):
                if not allow_templates:
                    raise _Decline("kernel template (not split with KERNELCRAFT_SPLIT=notemplates)")
                tpl = _template_head(header)
                if tpl is None:
                    raise _Decline("kernel template parameters not understood")
                templates[name] = tpl
                decl += f"\n{tpl} void* kc_split_addr_{name}();"
            kernels[name] = decl
        placed.append((text, mtext, where, decl))
    if not kernels:
        raise _Decline("no kernel")
    cuda_parts, host_parts = [], []
    for text, mtext, where, decl in placed:
        on_device = where in ("kernel", "device", "both")
        on_host = where in ("host", "both")
        if on_device:
            if _NAMES_TORCH.search(mtext):
                raise _Decline("device code names torch")
            if "<<<" in mtext:
                raise _Decline("launch from device code")
            cuda_parts.append(text)
        else:
            cuda_parts.append("\n" * text.count("\n"))
        if where == "kernel":
            host_parts.append(decl + "\n")
        elif on_host:
            rewritten = _rewrite_launches(text, mtext, kernels, templates, instances) if "<<<" in mtext else text
            if rewritten is None:
                raise _Decline("launch not understood (not a kernel name, template arguments, dispatch macro)")
            host_parts.append(rewritten)
    head = ""
    if templates:
        if not instances:
            raise _Decline("kernel template never launched from host code")
        cuda_parts.append(cutemplates.instantiations(templates, instances))
        # before the candidate's code, as torch's headers are in a plain build (its errors are never shown:
        # a split that fails falls back, so the shifted line numbers do not matter)
        head = "".join(f"#include <c10/util/{h}.h>\n" for h in ("Half", "BFloat16")
                       if any(f"c10::{h}" in targs for _, targs in instances))
    host = "#include <cuda_runtime.h>\n" + LAUNCHER + "".join(host_parts)
    return Split(cuda=head + "".join(cuda_parts), host=host, kernels=list(kernels))


def _template_head(header: str) -> str | None:
    """`template <...>` of a kernel template's header; None for what `cutemplates.template_param_names` cannot name."""
    rest = _strip_template_params(header)
    tpl = " ".join(header[:len(header) - len(rest)].split())
    return tpl if cutemplates.template_param_names(tpl) is not None else None


def _mask(src: str) -> str | None:
    """`src` with comments and the insides of string/char literals blanked (same length; newlines kept)."""
    out = list(src)
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out[i:j] = " " * (j - i)
            i = j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            if j < 0:
                return None
            out[i:j + 2] = [ch if ch == "\n" else " " for ch in src[i:j + 2]]
            i = j + 2
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c:
                if src[j] == "\n":
                    return None
                j += 2 if src[j] == "\\" else 1
            if j >= n:
                return None
            out[i + 1:j] = " " * (j - i - 1)
            i = j + 1
        else:
            i += 1
    return "".join(out)


def _chunks(src: str, masked: str) -> list[tuple[str, str]] | None:
    """Top-level chunks (original text, masked text): preprocessor lines, and declarations or definitions
    ending with `;` or, for function definitions, with their closing brace. Whitespace goes with the
    chunk that follows it."""
    chunks, start, i, n = [], 0, 0, len(masked)
    depth = 0  # braces and parens together
    while i < n:
        c = masked[i]
        if depth == 0 and c == "#" and masked[start:i].strip() == "" and _at_line_start(masked, i):
            j = i
            while True:  # the directive, with its backslash continuations
                k = masked.find("\n", j)
                if k < 0:
                    j = n
                    break
                if masked[k - 1] == "\\":
                    j = k + 1
                    continue
                j = k + 1
                break
            chunks.append((src[start:j], masked[start:j]))
            start = i = j
            continue
        if c == "#" and depth == 0 and _at_line_start(masked, i):
            return None  # a directive in the middle of a declaration
        if c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
            if depth < 0:
                return None
            if c == "}" and depth == 0 and _is_function_definition(masked[start:i + 1]):
                chunks.append((src[start:i + 1], masked[start:i + 1]))
                start = i + 1
        elif c == ";" and depth == 0:
            chunks.append((src[start:i + 1], masked[start:i + 1]))
            start = i + 1
        i += 1
    if depth != 0:
        return None
    if masked[start:].strip():
        return None  # trailing text that is not a complete declaration
    if start < n:
        chunks.append((src[start:], masked[start:]))
    return chunks


def _at_line_start(text: str, i: int) -> bool:
    j = text.rfind("\n", 0, i)
    return text[j + 1:i].strip() == ""


def _is_function_definition(mtext: str) -> bool:
    """Does this text, ending with a closing brace at depth 0, define a function (not a type or a
    brace-initialised variable, which end with `;`)?"""
    head = _strip_template_params(mtext.split("{", 1)[0])
    if re.search(r"\b(?:struct|class|union|enum|namespace)\b", head):
        return False
    d0 = _depth0(head).rstrip()
    if "=" in d0 or "(" not in d0:
        return False
    return re.search(r"\)\s*(?:(?:const|noexcept|override|final)\b\s*)*(?:->[^{;]*)?$", d0) is not None


def _strip_template_params(header: str) -> str:
    m = re.match(r"\s*template\s*<", header)
    return header[cutemplates.past_close(header, m.end(), "<>"):] if m else header


def _depth0(text: str) -> str:
    """The characters of `text` outside any parentheses/brackets (the groups become `()`)."""
    out, depth = [], 0
    for c in text:
        if c in "([":
            if depth == 0:
                out.append("(")
            depth += 1
        elif c in ")]":
            depth -= 1
            if depth == 0:
                out.append(")")
        elif depth == 0:
            out.append(c)
    return "".join(out)


def _classify(mtext: str) -> str | None:
    """Where a chunk goes: kernel, device, both, host; None to decline."""
    body = mtext.strip()
    if not body:
        return "both"
    if body.startswith("#"):
        if _TORCH_INCLUDE.match(body) or _NAMES_TORCH.search(body):
            return "host"  # torch's headers, and macros naming torch (CHECK_CUDA(x) -> TORCH_CHECK ...)
        if re.match(r"#\s*(?:include|define|undef|pragma)\b", body):
            return "both"
        return None
    if re.search(r'\bextern\s*"|\bnamespace\s*\w*\s*\{', body):  # linkage specs (strings blanked), namespaces
        return None
    if re.match(r"namespace\b", body):
        return "host"  # a namespace alias (`namespace py = pybind11;`)
    is_def = body.endswith("}") and _is_function_definition(body)
    header = body.split("{", 1)[0] if is_def else body
    quals = set(re.findall(r"\b(__global__|__device__|__host__)\b", header))
    if "__global__" in quals:
        return "kernel" if is_def or _function_name(header.rstrip(";")) else None
    if "__device__" in quals:
        if not is_def and not _function_name(header.rstrip(";")):
            return None  # a __device__ variable
        return "both" if "__host__" in quals else "device"
    if "__shared__" in header:
        return "device"  # a file-scope `extern __shared__` array
    if is_def:
        return "host"
    if _NAMES_TORCH.search(body):
        return "host"
    if re.match(r"(?:typedef|using|static_assert)\b", body) or re.match(
            r"(?:template\s*<.*?>\s*)?(?:struct|class|union|enum)\b", body, re.DOTALL):
        return "both"
    head = _depth0(_strip_template_params(body))
    if "=" in head or "(" not in head:  # a variable: constants to both, mutable globals stay on the host
        return "both" if re.search(r"\b(?:const|constexpr)\b", head) else "host"
    return "host"  # a host function's prototype


def _function_name(header: str) -> str | None:
    """The declared function's name: the identifier before the header's only parameter list."""
    h = _remove_call(_remove_call(_strip_template_params(header), _LAUNCH_BOUNDS), _ATTRIBUTE)
    d0 = _depth0(h)
    m = re.search(r"(\w+)\s*\(", d0)
    if d0.count("(") != 1 or not m or m.group(1) in _KEYWORDS:
        return None
    return m.group(1)


def _remove_call(text: str, opener: re.Pattern) -> str:
    """`text` without each `opener(...)` (balanced parentheses)."""
    while (m := opener.search(text)) is not None:
        text = text[:m.start()] + " " + text[cutemplates.past_close(text, m.end()):]
    return text


def _host_declaration(header: str) -> str:
    h = _remove_call(header, _LAUNCH_BOUNDS)
    h = re.sub(r"\b__global__\b", "", h)
    return h.strip()


# a launch: NAME [<template args>] <<<   (template args: one level of nested <> allowed)
_LAUNCH = re.compile(r"\b([A-Za-z_]\w*)\s*(<(?:[^<>;{}]|<[^<>;{}]*>)*>)?\s*<<<")


def _rewrite_launches(text: str, mtext: str, kernels: dict, templates: dict, instances: list) -> str | None:
    """Each `k<<<cfg>>>(args)` of a known kernel `k` (`k<targs><<<` of a kernel template) becomes
    `kc_split_launch(k, cfg)(args)`; any other `<<<` declines. The template instantiations the launches
    need are appended to `instances` (`("k", "<float>")`; `scalar_t` under an AT_DISPATCH macro stands for
    each of the macro's types); main.cpp gets the template's stub through `kc_split_addr_k<...>()`."""
    out, pos = [], 0
    found = list(_LAUNCH.finditer(mtext))
    if mtext.count("<<<") != len(found):
        return None
    for m in found:
        name, targs = m.group(1), m.group(2)
        if name not in kernels or bool(targs) != (name in templates):
            return None  # not a kernel, a template without its arguments, or arguments to a non-template
        close = mtext.find(">>>", m.end())
        if close < 0 or "<<<" in mtext[m.end():close] or not re.match(r"\s*\(", mtext[close + 3:]):
            return None
        cfg = text[m.end():close]
        if not 2 <= _depth0(mtext[m.end():close]).count(",") + 1 <= 4:
            return None
        kernel = name
        if targs:
            types = cutemplates.dispatch_types(mtext, m.start()) if cutemplates.SCALAR_T.search(targs) else [None]
            if types is None:
                return None
            for t in types:
                inst = (name, targs if t is None else cutemplates.SCALAR_T.sub(t, targs))
                if inst not in instances:
                    instances.append(inst)
            targs = " ".join(text[m.start(2):m.end(2)].split())
            kernel = f"reinterpret_cast<decltype(&{name}{targs})>(kc_split_addr_{name}{targs}())"
        out.append(text[pos:m.start()])
        out.append(f"kc_split_launch({kernel}, {cfg.strip()})")
        pos = close + 3
    out.append(text[pos:])
    return "".join(out)
