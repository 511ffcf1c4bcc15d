"""Where the judge's round trip loses resolution on a GPU, and what timing calls in bursts would win.

Standalone (no kernelcraft imports): a judge process and one side process, forked before CUDA is touched,
talking over a socket pair as the real judge does. The side's forward is one `torch.cuda._sleep` kernel of
10 µs, 100 µs or 1 ms (calibrated with CUDA events). Three protocols, each with its null (the same round trip
without the sleep) measured alongside:

- `single`: today's sample — judge flushes L2, then: thaw, request, forward + sync, reply, freeze, the judge's
  idle probe. One call per sample.
- `burst`: one thaw, k requests one after another (the judge does no GPU work between them), one freeze and
  one probe; the sample is the burst's time divided by k.
- `burst_probe` / `burst_freeze`: as `burst`, with the judge's idle probe (or a freeze and thaw) after every call,
  to tell which part of today's sample carries its noise; `burst_cheat` / `burst_probe_cheat`: a side that answers
  before its device work is done (no sync), to see whether the protocol bills that work to it.
- `burst_masked`: as `burst`, but before each forward the side derives its input from a key that arrives with the
  request (a device-generated random mask XORed over an input slot of `--input-mib`): the cost of inputs the
  candidate cannot read ahead of its call.

For each: the per-call time with the null's median subtracted, its spread, and the rounds (pairs of samples)
a ±1% CI of a median ratio would need at that spread, times what a round costs.

    python3 benchmarks/burst_probe.py --out burst.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import statistics
import struct
import sys
import time

_MSG = struct.Struct("!iiq")  # op, microseconds, key


def side(sock: socket.socket, input_mib: float) -> None:
    import torch

    dev = torch.device("cuda")
    torch.cuda.init()
    n = max(1, int(input_mib * (1 << 20)) // 4)
    slot = torch.randint(-1 << 31, (1 << 31) - 1, (n,), dtype=torch.int32, device=dev)
    work = torch.empty_like(slot)
    mask = torch.empty_like(slot)
    out = torch.zeros(256, device=dev)
    gen = torch.Generator(device=dev)
    # cycles per µs for _sleep
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(1_000_000)
    b.record()
    b.synchronize()
    per_us = 1_000_000 / (a.elapsed_time(b) * 1000)
    sock.sendall(struct.pack("!d", per_us))
    while True:
        data = sock.recv(_MSG.size, socket.MSG_WAITALL)
        if len(data) < _MSG.size:
            os._exit(0)
        op, us, key = _MSG.unpack(data)
        if op == 2:  # masked: derive the input from the key first
            gen.manual_seed(key)
            torch.randint(-1 << 31, (1 << 31) - 1, (n,), dtype=torch.int32, device=dev, generator=gen, out=mask)
            torch.bitwise_xor(slot, mask, out=work)
        if us > 0:
            torch.cuda._sleep(int(us * per_us))
        out.add_(1)  # the output copy
        if op != 3:  # op 3: a cheat that answers before its device work is done
            torch.cuda.synchronize()
        sock.sendall(b"d")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels-us", default="10,100,1000")
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--input-mib", type=float, default=16.0)
    ap.add_argument("--protocols", default="single,burst,burst_masked")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not os.path.exists("/dev/nvidiactl"):  # checked without CUDA: the side must be forked before CUDA starts
        sys.exit("burst_probe.py needs an NVIDIA GPU (it times GPU contexts switching between two processes)")
    mine, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        mine.close()
        os.setsid()
        side(theirs, args.input_mib)
        os._exit(0)
    theirs.close()
    import torch

    per_us = struct.unpack("!d", mine.recv(8, socket.MSG_WAITALL))[0]
    dev = torch.device("cuda")
    flush_buf = torch.empty(128 << 20 >> 2, dtype=torch.int32, device=dev)
    probe_buf = torch.zeros(1, dtype=torch.int32, device=dev)
    ns = time.perf_counter_ns
    frozen = [False]

    def freeze():
        os.killpg(pid, signal.SIGSTOP)
        while True:
            _, st = os.waitpid(pid, os.WUNTRACED)
            if os.WIFSTOPPED(st):
                break
        frozen[0] = True

    def thaw():
        os.killpg(pid, signal.SIGCONT)
        frozen[0] = False

    def probe():
        probe_buf.add_(1)
        torch.cuda.synchronize()

    def call(op, us, key=0):
        mine.sendall(_MSG.pack(op, us, key))
        mine.recv(1, socket.MSG_WAITALL)

    keys = iter(range(1, 1 << 40, 7919))

    def single(us):
        flush_buf.zero_()
        torch.cuda.synchronize()
        t0 = ns()
        thaw()
        call(1, us)
        freeze()
        probe()
        return (ns() - t0) / 1e3

    def burst(us, masked, per_call="", op=None):
        flush_buf.zero_()
        torch.cuda.synchronize()
        t0 = ns()
        thaw()
        for j in range(args.k):
            call(op or (2 if masked else 1), us, next(keys))
            if per_call == "probe":
                probe()
            elif per_call == "freeze" and j < args.k - 1:
                freeze()
                thaw()
        freeze()
        probe()
        return (ns() - t0) / 1e3 / args.k

    freeze()
    report = {"cycles_per_us": per_us, "k": args.k, "input_mib": args.input_mib, "rows": []}
    for us in [int(x) for x in args.kernels_us.split(",")]:
        for proto in args.protocols.split(","):
            fn = {"single": single,
                  "burst": lambda u: burst(u, False),
                  "burst_masked": lambda u: burst(u, True),
                  "burst_probe": lambda u: burst(u, False, "probe"),
                  "burst_freeze": lambda u: burst(u, False, "freeze"),
                  "burst_probe_cheat": lambda u: burst(u, False, "probe", op=3) if u else burst(u, False, "probe"),
                  "burst_cheat": lambda u: burst(u, False, op=3) if u else burst(u, False)}[proto]
            for _ in range(5):
                fn(us), fn(0)
            n = args.samples if proto == "single" else max(20, args.samples // 4)
            runs, nulls = [], []
            for _ in range(n):
                runs.append(fn(us))
                nulls.append(fn(0))
            o = statistics.median(nulls)
            corr = [r - o for r in runs]
            med = statistics.median(corr)
            q = statistics.quantiles(corr, n=20)
            # spread of a ratio of two such samples ~ sqrt(2) x; n for a ±1% CI of its median (normal approx.)
            cv = (q[14] - q[4]) / 1.349 / med if med > 0 else float("inf")  # IQR-based sd / median
            need = math.ceil((1.96 * 1.2533 * math.sqrt(2) * cv / 0.01) ** 2) if med > 0 else None
            cost_ms = 2 * (statistics.median(runs) + o) * (1 if proto == "single" else args.k) / 1e3
            row = {"kernel_us": us, "protocol": proto, "null_us": round(o, 1), "null_iqr_us": round(
                statistics.quantiles(nulls, n=4)[2] - statistics.quantiles(nulls, n=4)[0], 1),
                "call_us": round(med, 1), "p5_us": round(q[0], 1), "p95_us": round(q[18], 1), "cv": round(cv, 4),
                "samples_for_1pct": need, "sample_cost_ms": round(cost_ms, 3),
                "seconds_for_1pct": round(need * cost_ms / 1e3, 2) if need else None}
            report["rows"].append(row)
            print(json.dumps(row), flush=True)
    thaw()
    mine.close()
    os.waitpid(pid, 0)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
