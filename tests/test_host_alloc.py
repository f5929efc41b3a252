"""keep_freed_host_blocks: a freed 20 MB block is reused by the next allocation without page faults
(glibc's default hands it back to the OS and faults it in again). Fresh processes: allocator state is global."""

import json
import subprocess
import sys

import pytest

SCRIPT = """
import json, resource, sys
import numpy as np
if sys.argv[1] == "on":
    from lazytrain_jax.host_alloc import keep_freed_host_blocks
    assert keep_freed_host_blocks()
faults = []
for _ in range(3):
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.ones(5_000_000, np.float32)
    del a
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
print(json.dumps(faults))
"""


def _faults(mode):
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_freed_blocks_are_reused_without_page_faults():
    from lazytrain_jax.host_alloc import keep_freed_host_blocks
    if not keep_freed_host_blocks():
        pytest.skip("no glibc mallopt here")
    on, off = _faults("on"), _faults("off")
    assert on[1] < 10 and on[2] < 10, on          # the second and third 20 MB blocks reuse the first
    assert off[1] > on[1], (off, on)              # the default faults the second one in again


ONCE = """
import inspect, json
from lazytrain_jax import host_alloc
calls, askers = [], []
real, once = host_alloc.keep_freed_host_blocks, host_alloc.keep_host_blocks_once
host_alloc.keep_freed_host_blocks = lambda: calls.append(1) or real()
host_alloc.keep_host_blocks_once = lambda: askers.append(inspect.stack()[1].function) or once()
import lazytrain_jax as lt
from lazytrain_jax.executor.profiler import profile
cfg = lt.get_preset("llama-debug").replace(num_layers=1, layer_kinds=("decoder",))
model = lt.init_model(cfg, seed=0)
costs, hw = profile(model, 1, 8, stream_dtype="float32", device_memory=1e9, repeats=1)
from lazytrain_jax.schedule.api import plan_for_costs
plan = plan_for_costs(costs, hw)
with lt.StreamingEngine(model, plan, stream_dtype="float32"):
    pass
print(json.dumps([once(), len(calls), askers]))
"""


@pytest.mark.parametrize("env,expected", [(None, True), ("0", False)])
def test_profile_and_engine_set_the_allocator_once_unless_told_not_to(env, expected):
    import os
    from lazytrain_jax.host_alloc import keep_freed_host_blocks
    if not keep_freed_host_blocks():
        pytest.skip("no glibc mallopt here")
    environ = {k: v for k, v in os.environ.items() if k != "LAZYTRAIN_KEEP_FREED_HOST_BLOCKS"}
    if env is not None:
        environ["LAZYTRAIN_KEEP_FREED_HOST_BLOCKS"] = env
    out = subprocess.run([sys.executable, "-c", ONCE], capture_output=True, text=True, check=True, env=environ)
    kept, calls, askers = json.loads(out.stdout.strip().splitlines()[-1])
    assert kept is expected
    assert {"profile", "__init__"} <= set(askers), askers   # lt.profile and the engine's constructor ask
    assert calls == (1 if expected else 0)   # glibc was set once at most


# ---- huge pages for glibc's large blocks (reexec_with_huge_pages) ----------------------------

BIG = """
import json, resource
import jax.numpy as jnp
x = jnp.ones(25_000_000, jnp.float32).block_until_ready()  # 100 MB on the CPU backend
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
y = (x * 2).block_until_ready()  # a fresh 100 MB block: above glibc's 32 MiB mmap limit, a new mapping
print(json.dumps(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0))
"""


HUGE_PAGE_VARS = ("GLIBC_TUNABLES", "LAZYTRAIN_HUGE_PAGES", "LAZYTRAIN_REEXEC_HUGE_PAGES")


def _clean_env(**extra):
    """This process's environment without the huge-page variables, plus ``extra`` (for a child)."""
    import os
    env = {k: v for k, v in os.environ.items() if k not in HUGE_PAGE_VARS}
    return {**env, **extra}


def _isolated(monkeypatch, supported=True):
    """host_alloc with the huge-page variables unset here and ``huge_pages_supported`` fixed."""
    from lazytrain_jax import host_alloc
    monkeypatch.setattr(host_alloc, "huge_pages_supported", lambda: supported)
    for k in HUGE_PAGE_VARS:
        monkeypatch.delenv(k, raising=False)
    return host_alloc


def test_huge_pages_cut_the_page_faults_of_a_large_block():
    from lazytrain_jax.host_alloc import HUGE_PAGES_TUNABLE, huge_pages_supported
    if not huge_pages_supported():
        pytest.skip("glibc < 2.35 or transparent huge pages off here")
    from lazytrain_jax.host_alloc import THP_ENABLED
    with open(THP_ENABLED) as f:
        if "[always]" in f.read():
            pytest.skip("transparent huge pages 'always': glibc's default mappings get them already")
    faults = {}
    for huge in (False, True):
        env = _clean_env(**({"GLIBC_TUNABLES": HUGE_PAGES_TUNABLE} if huge else {}))
        out = subprocess.run([sys.executable, "-c", BIG], capture_output=True, text=True, check=True,
                             env={**env, "JAX_PLATFORMS": "cpu"})
        faults[huge] = json.loads(out.stdout)
    assert faults[False] > 20_000, faults     # 4 KiB pages: one fault each
    assert faults[True] < faults[False] / 4, faults  # 2 MiB pages where the kernel has them free


@pytest.mark.parametrize("opt_out", [False, True])
def test_the_command_starts_itself_again_with_huge_pages_unless_told_not_to(opt_out):
    from lazytrain_jax.host_alloc import huge_pages_supported
    env = _clean_env(**({"LAZYTRAIN_HUGE_PAGES": "0"} if opt_out else {}))
    out = subprocess.run([sys.executable, "-m", "lazytrain_jax.cli", "version"], capture_output=True, text=True,
                         check=True, env=env)
    on = huge_pages_supported() and not opt_out
    assert f"huge pages for large blocks {'on' if on else 'off'}" in out.stdout, out.stdout


def test_reexec_keeps_the_arguments_and_other_tunables(monkeypatch):
    host_alloc = _isolated(monkeypatch)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    monkeypatch.setattr(sys, "orig_argv", ["python", "-X", "faulthandler", "prog.py", "--flag", "x"])
    monkeypatch.setattr(sys, "argv", ["prog.py", "--flag", "x"])
    calls = []
    assert host_alloc.reexec_with_huge_pages(execve=lambda *a: calls.append(a))
    (path, argv, env), = calls
    assert path == sys.executable and argv == ["python", "-X", "faulthandler", "prog.py", "--flag", "x"]
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert host_alloc.huge_pages_on(env)
    # the process started again does not start itself once more
    monkeypatch.setattr(host_alloc.os, "environ", env)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")  # even were the tunable dropped
    assert not host_alloc.reexec_with_huge_pages(execve=lambda *a: calls.append(a))
    assert len(calls) == 1


@pytest.mark.parametrize("case", ["opt_out", "already_on", "unsupported"])
def test_reexec_does_nothing_where_it_should_not(monkeypatch, case):
    host_alloc = _isolated(monkeypatch, supported=case != "unsupported")
    if case == "opt_out":
        monkeypatch.setenv("LAZYTRAIN_HUGE_PAGES", "0")
    if case == "already_on":
        monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
    calls = []
    assert not host_alloc.reexec_with_huge_pages(execve=lambda *a: calls.append(a))
    assert calls == []


@pytest.mark.parametrize("orig,argv,expected", [
    (["/usr/bin/python3", "/usr/local/bin/lazytrain", "demo"], ["/usr/local/bin/lazytrain", "demo"], True),
    (["python", "examples/finetune_metamathqa.py", "--steps", "3"], ["examples/finetune_metamathqa.py", "--steps", "3"], True),
    (["python", "-m", "lazytrain_jax.cli", "version"], ["/src/lazytrain_jax/cli.py", "version"], True),
    # a test process running the example through runpy, its arguments patched in
    (["python", "-u", "-c", "import sys;exec(eval(sys.stdin.readline()))"], ["examples/finetune_metamathqa.py"], False),
    (["python", "-m", "pytest"], ["examples/finetune_metamathqa.py"], False),
    (["python", "-m", "pytest", "-q"], ["examples/finetune_metamathqa.py", "-q"], False),
    (["python", "-c", "print(1)"], ["-c"], False),
])
def test_runs_as_program_tells_the_process_program_from_one_run_inside_it(orig, argv, expected):
    from lazytrain_jax.host_alloc import runs_as_program
    assert runs_as_program(orig, argv) is expected


@pytest.mark.parametrize("case", ["warns", "small", "on", "opt_out", "unsupported"])
def test_hint_huge_pages_warns_once_where_they_would_help(monkeypatch, case):
    import warnings
    host_alloc = _isolated(monkeypatch, supported=case != "unsupported")
    monkeypatch.setattr(host_alloc, "_HINTED", [])
    if case == "on":
        monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
    if case == "opt_out":
        monkeypatch.setenv("LAZYTRAIN_HUGE_PAGES", "0")
    size = 16 * 2**20 if case == "small" else 545e6
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, second = host_alloc.hint_huge_pages(size), host_alloc.hint_huge_pages(size)
    assert first is (case == "warns") and second is False
    assert len(caught) == (1 if case == "warns" else 0)
    if caught:
        assert "GLIBC_TUNABLES=glibc.malloc.hugetlb=1" in str(caught[0].message)
        assert "520 MiB" in str(caught[0].message)


def test_the_engine_hints_for_a_large_table_only():
    """A tiny model's engine stays silent; the hint's size is the model's largest fp32 tensor."""
    import warnings
    import lazytrain_jax as lt
    from lazytrain_jax import host_alloc
    from lazytrain_jax.executor.profiler import unit_costs
    from lazytrain_jax.schedule.hardware import Hardware
    from lazytrain_jax.schedule.plan import Plan
    seen = []
    real = host_alloc.hint_huge_pages
    host_alloc.hint_huge_pages = lambda n: seen.append(n) or real(n)
    try:
        cfg = lt.get_preset("llama-debug").replace(num_layers=1, layer_kinds=("decoder",))
        model = lt.init_model(cfg, seed=0)
        costs = unit_costs(model, batch_size=1, seq_len=8, stream_dtype="float32")
        hw = Hardware(device_memory=1e12, h2d_bw=1e10, d2h_bw=1e10, device_flops=1e11)
        plan = Plan.create(costs, hw, name="p", boundary_tiers=["device"] * 2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with lt.StreamingEngine(model, plan, stream_dtype="float32"):
                pass
    finally:
        host_alloc.hint_huge_pages = real
    import numpy as np
    largest = max(4 * int(np.prod(x.shape)) for x in __import__("jax").tree.leaves(model.params))
    assert seen == [largest]
    assert not [w for w in caught if "GLIBC_TUNABLES" in str(w.message)]


def test_reexec_runs_on_where_the_interpreter_cannot_be_started_again(monkeypatch):
    host_alloc = _isolated(monkeypatch)
    monkeypatch.setattr(sys, "orig_argv", ["python", "prog.py"])
    monkeypatch.setattr(sys, "argv", ["prog.py"])

    def failing(*_):
        raise PermissionError("not allowed")
    assert not host_alloc.reexec_with_huge_pages(execve=failing)
