"""Which GPU kernels ran: CUPTI's activity API through ctypes, without torch.profiler.

Records CONCURRENT_KERNEL activity (every kernel executed, CUDA graph replays included) and reads `kind` and `name`
at fixed offsets. A layout it does not understand cannot pass for evidence: the tracer is used only when a probe
kernel's name comes back; otherwise callers fall back to torch.profiler.

Rationale: docs/design/judge-tripwires.md#kerneltrace
"""
from __future__ import annotations

import ctypes
import glob
import os
import threading

KIND_CONCURRENT_KERNEL = 10
NAME_OFFSET = 104  # offsetof(CUpti_ActivityKernel{4..10}, name)
BUFFER_BYTES = 1 << 20
_OK = 0

_BufferRequested = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.POINTER(ctypes.c_uint8)),
                                    ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t))
_BufferCompleted = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint8),
                                    ctypes.c_size_t, ctypes.c_size_t)


def cupti_path() -> str | None:
    """The CUPTI shared library: the copy this process already mapped, else the usual places."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rsplit(None, 1)[-1]
                if "/libcupti.so" in path and os.path.exists(path):
                    return path
    except OSError:
        pass
    import torch

    site = os.path.dirname(os.path.dirname(torch.__file__))
    patterns = [os.path.join(site, "nvidia", "*", "lib", "libcupti.so*"),
                os.path.join(site, "nvidia", "cuda_cupti", "lib", "libcupti.so*")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            patterns += [os.path.join(home, "extras", "CUPTI", "lib64", "libcupti.so*"),
                         os.path.join(home, "lib64", "libcupti.so*")]
    for pattern in patterns:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return "libcupti.so"  # the loader's search path, if anywhere


class Tracer:
    """Names of the kernels that executed between `begin()` and `end()`. One per process (CUPTI allows
    one set of activity callbacks); `start()` loads CUPTI and proves the record layout on a probe."""

    def __init__(self):
        self.lib = None
        self.usable = False
        self.why = "not started"
        self._names: set[str] = set()
        self._buffers: dict[int, ctypes.Array] = {}
        self._lock = threading.Lock()
        self._cbs = (_BufferRequested(self._requested), _BufferCompleted(self._completed))

    # CUPTI calls these (flush, or its own thread); exceptions cannot propagate into C
    def _requested(self, buf, size, max_records):
        arr = (ctypes.c_uint8 * BUFFER_BYTES)()
        with self._lock:
            self._buffers[ctypes.addressof(arr)] = arr
        buf[0] = ctypes.cast(arr, ctypes.POINTER(ctypes.c_uint8))
        size[0] = BUFFER_BYTES
        max_records[0] = 0

    def _completed(self, ctx, stream_id, buf, size, valid):
        try:
            record = ctypes.c_void_p()
            while valid and self.lib.cuptiActivityGetNextRecord(buf, ctypes.c_size_t(valid),
                                                                 ctypes.byref(record)) == _OK:
                if ctypes.c_uint32.from_address(record.value).value == KIND_CONCURRENT_KERNEL:
                    name = ctypes.c_char_p.from_address(record.value + NAME_OFFSET).value
                    if name:
                        self._names.add(name.decode(errors="replace"))
        except Exception:  # noqa: BLE001 - never raise into CUPTI
            pass
        finally:
            with self._lock:
                self._buffers.pop(ctypes.cast(buf, ctypes.c_void_p).value, None)

    def start(self, probe) -> bool:
        """Load CUPTI and register callbacks; usable only if tracing `probe()` names a kernel."""
        try:
            self.lib = ctypes.CDLL(cupti_path())
            for fn in ("cuptiActivityRegisterCallbacks", "cuptiActivityEnable", "cuptiActivityDisable",
                       "cuptiActivityFlushAll", "cuptiActivityGetNextRecord"):
                getattr(self.lib, fn).restype = ctypes.c_int
            rc = self.lib.cuptiActivityRegisterCallbacks(*self._cbs)
            if rc != _OK:
                self.why = f"cuptiActivityRegisterCallbacks returned {rc}"
                return False
        except (OSError, AttributeError) as e:
            self.why = f"CUPTI not loadable: {e}"
            return False
        self.usable = True
        try:
            names = self.trace(probe) or set()
        except Exception as e:  # noqa: BLE001
            names, self.why = set(), f"probe failed: {e}"
        if not names or not all(n.isprintable() for n in names):
            self.usable = False
            self.why = f"the probe kernel was not seen (records read: {sorted(names)[:3]})"
        return self.usable

    def begin(self) -> None:
        self.flush()
        self._names = set()
        rc = self.lib.cuptiActivityEnable(KIND_CONCURRENT_KERNEL)
        if rc != _OK:
            raise RuntimeError(f"cuptiActivityEnable returned {rc}")

    def end(self) -> set[str]:
        import torch

        torch.cuda.synchronize()
        self.lib.cuptiActivityDisable(KIND_CONCURRENT_KERNEL)
        self.flush()
        names, self._names = self._names, set()
        return names

    def flush(self) -> None:
        self.lib.cuptiActivityFlushAll(1)  # CUPTI_ACTIVITY_FLAG_FLUSH_FORCED

    def trace(self, fn) -> set[str] | None:
        """Run `fn` and name the kernels that ran; None if CUPTI refused to trace (then `fn` still runs).
        An exception of `fn` propagates, after tracing has stopped."""
        if not self.usable:
            raise RuntimeError(f"kernel tracer unusable: {self.why}")
        try:
            self.begin()
        except Exception:  # noqa: BLE001
            fn()
            return None
        names = None
        try:
            fn()
        finally:
            try:
                names = self.end()
            except Exception:  # noqa: BLE001
                names = None
        return names


_TRACER: Tracer | None = None


def tracer(probe=None) -> Tracer:
    """The process's tracer, started on first use with `probe` (a call that launches one kernel)."""
    global _TRACER
    if _TRACER is None:
        _TRACER = Tracer()
        if probe is not None:
            _TRACER.start(probe)
    return _TRACER
