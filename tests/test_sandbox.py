"""The worker sandbox: secrets scrubbed and rlimits set in every mode; with bubblewrap (when it works here)
no network, no writes outside the work dir and cache, a private /tmp and PID namespace. Most checks run a
small probe program through `sandbox.prepare` directly (no torch, fast); two run real evaluations through
the runner's hook.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelcraft.judge.caller import sandbox
from kernelcraft.evaluate import evaluate

FIXTURES = Path(__file__).parent / "fixtures"
HAS_BWRAP = sandbox.bwrap_path() is not None
needs_bwrap = pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap not installed or no namespaces here")

PROBE = r"""
import json, os, resource, socket, subprocess, sys
out = {"core": resource.getrlimit(resource.RLIMIT_CORE), "nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
       "env_key": os.environ.get("KERNELCRAFT_API_KEY"), "env_token": os.environ.get("HF_TOKEN"),
       "env_plain": os.environ.get("KC_PLAIN"), "pid": os.getpid()}
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[2])), timeout=2).close()
    out["net"] = "open"
except OSError as e:
    out["net"] = "blocked"
for name, path in (("outside", sys.argv[3]), ("home", sys.argv[4]), ("tmp", sys.argv[5]),
                   ("work", "inside.txt")):
    try:
        with open(path, "w") as f:
            f.write("x")
        out[name] = "written"
    except OSError:
        out[name] = "denied"
try:  # raise a limit back up: must fail (soft == hard)
    resource.setrlimit(resource.RLIMIT_CORE, (1 << 20, 1 << 20))
    out["raised"] = True
except (ValueError, OSError):
    out["raised"] = False
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
"""


@pytest.fixture
def probe(tmp_path):
    """Run PROBE sandboxed in `mode`; a TCP listener on the host tells whether the network is reachable."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    cache = tmp_path / "cache"
    work = cache / "work" / "eval-1"
    work.mkdir(parents=True)
    (work / "probe.py").write_text(PROBE)
    outside = tmp_path / "outside.txt"  # under /tmp: the sandbox's private /tmp takes the write
    home = Path.home() / f".kc-sandbox-probe-{os.getpid()}"  # outside /tmp: read-only in the sandbox
    tmp_file = Path(f"/tmp/kc-sandbox-probe-{os.getpid()}")

    def run(mode: str) -> dict:
        env = dict(os.environ, KERNELCRAFT_API_KEY="secret-key", HF_TOKEN="hf_secret", KC_PLAIN="kept")
        argv, env = sandbox.prepare([sys.executable, str(work / "probe.py"), str(work / "out.json"),
                                     str(listener.getsockname()[1]), str(outside), str(home), str(tmp_file)], env,
                                    work_dir=work, cache_dir=cache, mode=mode)
        r = subprocess.run(argv, env=env, cwd=work, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return json.loads((work / "out.json").read_text())

    yield run, outside, home, tmp_file
    listener.close()
    home.unlink(missing_ok=True)
    tmp_file.unlink(missing_ok=True)


def test_secrets_are_scrubbed_from_the_environment():
    env = {"KERNELCRAFT_API_KEY": "k", "HF_TOKEN": "t", "OPENAI_API_KEY": "o", "AWS_SECRET_ACCESS_KEY": "a",
           "AWS_REGION": "r", "SSH_AUTH_SOCK": "/s", "DB_PASSWORD": "p", "PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0",
           "TORCH_EXTENSIONS_DIR": "/c", "KEYBOARD": "us"}
    assert sandbox.scrub_env(env) == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0", "TORCH_EXTENSIONS_DIR": "/c",
                                      "KEYBOARD": "us"}


def test_modes_and_their_errors(monkeypatch):
    with pytest.raises(sandbox.SandboxError, match="KERNELCRAFT_SANDBOX"):
        sandbox.mode_from_env("docker")
    argv, env = sandbox.prepare(["python", "-V"], {"KERNELCRAFT_API_KEY": "k"}, work_dir="/w", cache_dir="/c",
                                mode="off")
    assert argv == ["python", "-V"] and env == {"KERNELCRAFT_API_KEY": "k"}
    monkeypatch.setattr(sandbox, "bwrap_path", lambda: None)
    with pytest.raises(sandbox.SandboxError, match="bubblewrap"):
        sandbox.prepare(["python", "-V"], {}, work_dir="/w", cache_dir="/c", mode="bwrap")
    argv, _ = sandbox.prepare(["python", "-V"], {}, work_dir="/w", cache_dir="/c", mode="auto")
    assert argv[-2:] == ["python", "-V"] and "bwrap" not in argv[0], "auto falls back to rlimits"
    assert sandbox.describe("auto")["effective"] == "rlimits"


def test_rlimits_mode(probe):
    run, outside, home, tmp_file = probe
    out = run("rlimits")
    assert out["core"] == [0, 0] and out["nofile"] == [sandbox.NOFILE, sandbox.NOFILE]
    assert out["raised"] is False, "the candidate must not raise its limits back"
    assert out["env_key"] is None and out["env_token"] is None and out["env_plain"] == "kept"
    assert out["work"] == "written"
    # documented: rlimits alone restrict neither the network nor writes
    assert out["net"] == "open" and out["outside"] == "written" and out["home"] == "written"


@needs_bwrap
def test_bwrap_mode_blocks_network_and_writes_outside(probe):
    run, outside, home, tmp_file = probe
    out = run("bwrap")
    assert out["net"] == "blocked"
    assert out["home"] == "denied" and not home.exists()
    assert not outside.exists(), "a write under /tmp lands in the sandbox's private /tmp, not the host's"
    assert out["work"] == "written" and out["tmp"] == "written"  # /tmp is private
    assert not tmp_file.exists()
    assert out["core"] == [0, 0] and out["env_key"] is None
    assert out["pid"] < 10, "a PID namespace of its own"


# -- through the runner's hook: real evaluations --------------------------------------------------

SANDBOX_CANDIDATE = '''
import os, resource, socket
import torch.nn as nn

def _escaped():
    """True if anything the sandbox should stop got through."""
    if resource.getrlimit(resource.RLIMIT_CORE) != (0, 0) or os.environ.get("KERNELCRAFT_API_KEY"):
        return True
    if os.environ.get("KC_EXPECT_BWRAP") == "1":
        try:
            open(os.environ["KC_OUTSIDE"], "w").write("escaped")
            return True
        except OSError:
            pass
        try:
            socket.create_connection(("127.0.0.1", int(os.environ["KC_PORT"])), timeout=2).close()
            return True
        except OSError:
            pass
    return False

class ModelNew(nn.Module):
    def __init__(self, alpha):
        super().__init__()
        self.alpha = alpha

    def forward(self, a, b):
        out = self.alpha * a + b
        return out + 1.0 if _escaped() else out
'''


@pytest.mark.parametrize("mode", ["rlimits", pytest.param("bwrap", marks=needs_bwrap)])
def test_the_runner_sandboxes_real_evaluations(mode, cache_dir, tmp_path, monkeypatch):
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    outside = tmp_path / "escaped.txt"
    monkeypatch.setenv("KERNELCRAFT_SANDBOX", mode)
    monkeypatch.setenv("KERNELCRAFT_API_KEY", "must-not-reach-the-candidate")
    monkeypatch.setenv("KC_EXPECT_BWRAP", "1" if mode == "bwrap" else "0")
    monkeypatch.setenv("KC_OUTSIDE", str(outside))
    monkeypatch.setenv("KC_PORT", str(listener.getsockname()[1]))
    try:
        v = evaluate(FIXTURES / "tasks" / "tiny_elementwise.py", SANDBOX_CANDIDATE, timing=False, trials=1,
                     timeout_s=30, screen=False)
    finally:
        listener.close()
    assert v.status == "correct", f"{v.status}/{v.reasons}: {v.message}"
    assert not outside.exists()
