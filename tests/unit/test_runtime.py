"""Thread and allocator settings that minidp makes for itself."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numba
import numpy as np
import pytest

from minidp.threads import THREAD_VARIABLES


def run(code, **env):
    # each case sets its own thread variables: none of the caller's may decide it
    full = {k: v for k, v in os.environ.items()
            if k not in ("MINIDP_NUM_THREADS", *THREAD_VARIABLES)}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_one_thread_per_rank_when_ranks_fill_the_cores():
    code = ("import minidp, threadpoolctl; "
            "print(max(p['num_threads'] for p in threadpoolctl.threadpool_info()))")
    cores = len(os.sched_getaffinity(0))
    assert run(code, MPI_LOCALNRANKS=str(cores)) == "1"
    assert run(code, MPI_LOCALNRANKS="1") == str(cores)
    assert run(code, MINIDP_NUM_THREADS="1", MPI_LOCALNRANKS="1") == "1"


def test_numba_imported_before_minidp_still_compiles_on_a_rank_of_one_thread():
    # Numba reads NUMBA_NUM_THREADS when it is imported, and every later compile checks
    # that the variable has not changed since its pool started. A program that imports
    # Numba (itself, or through a library) before minidp, on a rank given one thread of
    # several cores, failed its next compile (a function of its own, or minidp's kernels
    # in a cold cache) with "Cannot set NUMBA_NUM_THREADS to a different value".
    cores = len(os.sched_getaffinity(0))
    code = ("import numba, minidp, numpy as np; "
            "from minidp.kernels.elementwise import relu_forward; "
            "relu_forward(np.ones(4, np.float32)); "
            "print(numba.njit(lambda a: a + 1)(1), numba.get_num_threads())")
    assert run(code, MPI_LOCALNRANKS=str(cores)) == "2 1"
    assert run(code, MINIDP_NUM_THREADS="1", MPI_LOCALNRANKS="1") == "2 1"
    # A parent's default that Numba has read stays listed as one: not the user's setting.
    listed = ("import numba, minidp, os; from minidp import threads; "
              "print(os.environ['MINIDP_THREAD_DEFAULTS'].split(',')[-1], "
              "'NUMBA_NUM_THREADS' in threads.user_environment())")
    assert run(listed, NUMBA_NUM_THREADS="2", MINIDP_THREAD_DEFAULTS="NUMBA_NUM_THREADS=2",
               MINIDP_NUM_THREADS="1") == "NUMBA_NUM_THREADS=2 False"


def test_a_parents_defaults_are_not_taken_for_the_users_setting():
    # A process that imported minidp (all cores, one rank) launches ranks that share the
    # cores, as `minidp compare` does: they decide again, and a user's setting still wins.
    cores = len(os.sched_getaffinity(0))
    child = ("import minidp, json, threadpoolctl; from minidp import threads; "
             "print(json.dumps([threads.choice(), "
             "max(p['num_threads'] for p in threadpoolctl.threadpool_info())]))")
    parent = ("import os, subprocess, sys, minidp; "
              "print(os.environ['OMP_NUM_THREADS'], os.environ['MINIDP_THREAD_DEFAULTS']); "
              "sys.stdout.flush(); "
              f"subprocess.run([sys.executable, '-c', {child!r}], env=dict(os.environ, "
              f"MPI_LOCALNRANKS='{cores}', **dict(a.split('=') for a in sys.argv[1:])))")
    full = {k: v for k, v in os.environ.items()
            if k not in ("MINIDP_NUM_THREADS", "MINIDP_THREAD_DEFAULTS", *THREAD_VARIABLES)}
    full["MPI_LOCALNRANKS"] = "1"

    def launch(*overrides):
        out = subprocess.run([sys.executable, "-c", parent, *overrides], env=full,
                             capture_output=True, text=True, check=True).stdout.splitlines()
        return out[0], json.loads(out[1])

    exported, (choice, pool) = launch()
    assert exported == (f"{cores} OMP_NUM_THREADS={cores},OPENBLAS_NUM_THREADS={cores},"
                        f"MKL_NUM_THREADS={cores},NUMBA_NUM_THREADS={cores}")
    assert choice == [1, f"{cores} core(s) / {cores} rank(s) on this node"] and pool == 1
    _, (choice, pool) = launch("OMP_NUM_THREADS=3")  # changed after the parent: the user's
    assert choice == [3, "OMP_NUM_THREADS=3"] and pool == 3


def test_an_explicit_thread_setting_is_honoured_and_reported():
    code = ("import minidp, json, threadpoolctl; from minidp import threads; "
            "print(json.dumps([threads.choice(), "
            "max(p['num_threads'] for p in threadpoolctl.threadpool_info())]))")
    cores = len(os.sched_getaffinity(0))
    # the user's OMP_NUM_THREADS wins over the cores / local ranks rule
    assert json.loads(run(code, OMP_NUM_THREADS="1", MPI_LOCALNRANKS="1")) == \
        [[1, "OMP_NUM_THREADS=1"], 1]
    assert json.loads(run(code, SLURM_CPUS_PER_TASK="1", MPI_LOCALNRANKS="1")) == \
        [[1, "SLURM_CPUS_PER_TASK=1"], 1]
    assert json.loads(run(code, MINIDP_NUM_THREADS="1", OMP_NUM_THREADS="2")) == \
        [[1, "MINIDP_NUM_THREADS=1"], 1]
    assert json.loads(run(code, MPI_LOCALNRANKS="1")) == \
        [[cores, f"{cores} core(s) / 1 rank(s) on this node"], cores]
    info = json.loads(run("import minidp.__main__ as m; m.main(['info'])", OMP_NUM_THREADS="1"))
    assert info["threads"]["threads_per_rank"] == 1
    assert info["threads"]["chosen_by"] == "OMP_NUM_THREADS=1"


def test_the_runtimes_idle_threads_wait_as_minidp_sets_unless_the_user_says_otherwise():
    # OpenBLAS reads its variable as NumPy loads it, OpenMP (Numba's layer) as it loads;
    # both load inside `import minidp`, and a child process gets the user's environment.
    code = ("import os, sys\n"
            "class Spy:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'numpy':\n"
            "            print('numpy', os.environ.get('OPENBLAS_THREAD_TIMEOUT'))\n"
            "sys.meta_path.insert(0, Spy())\n"
            "import minidp\n"
            "print('after', os.environ.get('OPENBLAS_THREAD_TIMEOUT'), "
            "os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))\n"
            "import numba\n"
            "print(numba.threading_layer())\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_THREAD_TIMEOUT", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT",
                        "MINIDP_NUM_THREADS", "MPI_LOCALNRANKS")}
    env["OMP_DISPLAY_ENV"] = "VERBOSE"  # libgomp prints the settings it read as it loads

    def child(**extra):
        proc = subprocess.run([sys.executable, "-c", code], env=dict(env, **extra),
                              capture_output=True, text=True, check=True)
        return proc.stdout.split("\n"), proc.stderr

    lines, settings = child()
    assert lines[:2] == ["numpy 14", "after None None None"]
    openmp = lines[2] == "omp"  # Numba's layer is OpenMP (else TBB or its own workqueue)
    # GNU OpenMP: asleep after 10000 rounds of spinning (a rank's threads fill the cores)
    assert not openmp or ("OMP_WAIT_POLICY = 'PASSIVE'" in settings
                          and "GOMP_SPINCOUNT = '10000'" in settings)
    # more ranks on this node than cores (a thread each): no spinning
    lines, settings = child(MPI_LOCALNRANKS=str(len(os.sched_getaffinity(0)) + 1))
    assert lines[1] == "after None None None"
    assert not openmp or "GOMP_SPINCOUNT = '0'" in settings
    lines, settings = child(OPENBLAS_THREAD_TIMEOUT="20", OMP_WAIT_POLICY="ACTIVE")
    assert lines[:2] == ["numpy 20", "after 20 ACTIVE None"]
    assert not openmp or ("OMP_WAIT_POLICY = 'ACTIVE'" in settings
                          and "GOMP_SPINCOUNT = '10000'" not in settings)


def test_a_bad_thread_variable_never_breaks_import_and_is_a_user_error_in_train():
    assert run("import minidp; print(minidp.threads.threads_per_rank())",
               MINIDP_NUM_THREADS="many", MPI_LOCALNRANKS="1") == \
        str(len(os.sched_getaffinity(0)))
    proc = subprocess.run([sys.executable, "-m", "minidp", "train", "--epochs", "1"],
                          capture_output=True, text=True,
                          env=dict(os.environ, MINIDP_NUM_THREADS="many"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("error: MINIDP_NUM_THREADS: got 'many', allowed: a "
                                   "positive integer (threads per rank)")


def test_the_jit_lock_is_per_user_and_a_stuck_holder_is_named(tmp_path):
    from minidp.kernels import jit

    assert run("from minidp.kernels import jit; print(jit.cache_dir())",
               NUMBA_CACHE_DIR=str(tmp_path / "mine")) == str(tmp_path / "mine")
    assert run("from minidp.kernels import jit; print(jit.cache_dir())",
               XDG_CACHE_HOME=str(tmp_path / "xdg")) == str(tmp_path / "xdg/minidp/numba")
    path = str(tmp_path / "locks" / "jit.lock")
    with jit.node_lock(path):
        assert open(path).read().startswith(f"pid {os.getpid()} on ")
        # a second holder in another process waits, then names the first
        code = ("from minidp.kernels import jit\n"
                f"with jit.node_lock({path!r}, timeout=0.5): pass")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert proc.returncode == 1
        assert (f"TimeoutError: JIT cache: the lock '{path}' is still held after 0.5 s, by pid "
                f"{os.getpid()} on ") in proc.stderr
    assert open(path).read() == ""  # released: no stale holder named
    with jit.node_lock(path, timeout=0.5):
        pass


def test_a_filled_kernel_cache_is_stamped_and_then_loaded_lazily(tmp_path, monkeypatch):
    from minidp.kernels import jit

    if not jit.jit_enabled():
        pytest.skip("NUMBA_DISABLE_JIT=1: no kernel cache")
    # a kernel module of its own, whose warm-up only records the dtypes it was called with
    source = tmp_path / "fake_kernels.py"
    source.write_text("calls = []\n\ndef warm(dtype):\n    calls.append(dtype)\n")
    spec = importlib.util.spec_from_file_location("fake_kernels", source)
    kernels = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "fake_kernels", kernels)
    spec.loader.exec_module(kernels)
    cache = tmp_path / "cache"
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(cache))
    monkeypatch.setattr(jit, "_warmups", [kernels.warm])
    monkeypatch.setattr(jit, "LOCK_TIMEOUT_S", 0.3)
    monkeypatch.setitem(jit._state, "ready", False)
    stamp = jit.cache_stamp()
    assert os.path.dirname(stamp) == str(cache) and not os.path.exists(stamp)
    jit.ensure_compiled()  # the first process fills the cache for both dtypes, then stamps
    assert kernels.calls == [np.float32, np.float64] and os.path.exists(stamp)
    monkeypatch.setitem(jit._state, "ready", False)
    # the next one neither warms nor waits for the lock (held here by another process)
    lock = jit.module_lock(str(source))
    holder = subprocess.Popen([sys.executable, "-c", f"import fcntl, time; f = open({lock!r}, "
                               "'a+'); fcntl.flock(f, fcntl.LOCK_EX); print('held', "
                               "flush=True); time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        jit.ensure_compiled()
        assert kernels.calls == [np.float32, np.float64]
        # an edited kernel file is another stamp: the module is filled again, under its lock
        os.utime(source, ns=(0, source.stat().st_mtime_ns + 1))
        assert jit.cache_stamp() == stamp  # touched, the same contents: the same kernels
        source.write_text(source.read_text() + "# edited\n")
        assert jit.cache_stamp() != stamp
        monkeypatch.setitem(jit._state, "ready", False)
        with pytest.raises(TimeoutError, match="is still held after 0.3 s"):
            jit.ensure_compiled()
    finally:
        holder.kill()
        holder.wait()


def test_the_prange_kernels_are_compiled_only_once_a_process_runs_more_than_one_thread(
        tmp_path, monkeypatch):
    from minidp.kernels import jit, threaded

    if not jit.jit_enabled():
        pytest.skip("NUMBA_DISABLE_JIT=1: no kernel cache")
    source = tmp_path / "tiered_kernels.py"
    source.write_text("calls = []\n\ndef warm(dtype):\n    calls.append(('serial', dtype))\n\n"
                      "def warm_parallel(dtype):\n    calls.append(('prange', dtype))\n")
    spec = importlib.util.spec_from_file_location("tiered_kernels", source)
    kernels = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "tiered_kernels", kernels)
    spec.loader.exec_module(kernels)
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(jit, "_warmups", [kernels.warm])
    monkeypatch.setattr(jit, "_parallel_warmups", [kernels.warm_parallel])
    monkeypatch.setitem(jit._state, "ready", False)
    monkeypatch.setitem(jit._state, "parallel_ready", False)
    jit.ensure_compiled()
    monkeypatch.setattr(threaded, "threads_in_force", lambda: 1)
    assert not threaded.spread(1 << 24)  # one thread: the serial kernels only
    assert kernels.calls == [("serial", np.float32), ("serial", np.float64)]
    assert os.path.exists(jit.cache_stamp()) and not os.path.exists(jit.cache_stamp(True))
    monkeypatch.setattr(threaded, "threads_in_force", lambda: 2)
    assert not threaded.spread(threaded.SPREAD_MIN_ELEMENTS - 1)  # too small to split
    assert len(kernels.calls) == 2
    assert threaded.spread(1 << 24) and threaded.spread(1 << 24)  # compiled at the first
    assert kernels.calls[2:] == [("prange", np.float32), ("prange", np.float64)]
    assert os.path.exists(jit.cache_stamp(True))


CACHED_THEN_COMPILED = """
import json, sys
import numpy as np
import minidp
import numba
from minidp.kernels import relu_forward, threaded

x = np.linspace(-1, 1, threaded.SPREAD_MIN_ELEMENTS * 2, dtype=np.float32)
spread = threaded.spread(x.size)
equal = bool((relu_forward(x) == np.maximum(x, 0)).all()  # the prange kernel where spread
             and (relu_forward(x[:100]) == np.maximum(x[:100], 0)).all())  # the serial one
registries = "numba.np.linalg" in sys.modules  # imported by Numba's registry refresh only
# what the refresh would have registered that code which hashes links against
from llvmlite import binding
secrets = binding.address_of_symbol("_numba_hashsecret_siphash_k0") is not None

@numba.njit
def user_function(a):  # not in any cache: compiled here, with the registries
    return np.sqrt((a * a).sum())  # array methods and math: the registries

print(json.dumps({"spread": spread, "equal": equal, "registries": registries,
                  "secrets": secrets, "compiled": user_function(np.array([3.0, 4.0])),
                  "after": "numba.np.linalg" in sys.modules}))
"""


def test_a_cached_kernel_loads_without_the_compilers_registries_and_compiling_still_works():
    from minidp.kernels import jit

    if not jit.jit_enabled():
        pytest.skip("NUMBA_DISABLE_JIT=1: no kernel cache")
    jit.ensure_compiled()
    threads = min(2, len(os.sched_getaffinity(0)))  # the prange kernels, where 2 cores
    if threads > 1:
        jit.ensure_compiled(parallel=True)
    got = json.loads(run(CACHED_THEN_COMPILED, MINIDP_NUM_THREADS=str(threads)))
    assert got == {"spread": threads > 1, "equal": True, "registries": False,
                   "secrets": True, "compiled": 5.0, "after": True}


# A kernel called in a copy of the package: where its compiled code was found, and how.
CALLED_IN_A_COPY = """
import importlib.util, json, os, sys
import numpy as np
# the copy's package, ahead of the editable install's finder (which precedes PYTHONPATH)
copy = os.path.join(os.environ["COPY"], "minidp")
spec = importlib.util.spec_from_file_location("minidp", os.path.join(copy, "__init__.py"),
                                              submodule_search_locations=[copy])
sys.modules["minidp"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sys.modules["minidp"])
from minidp.kernels import checksum
checksum._warm(np.float32)
stats = checksum._checksum_kernel.stats
print(json.dumps({"file": checksum.__file__, "path": stats.cache_path,
                  "hits": sum(stats.cache_hits.values()),
                  "misses": sum(stats.cache_misses.values())}))
"""


def test_a_second_checkout_finds_the_kernels_the_first_compiled_and_an_edit_compiles_again(
        tmp_path):
    # Numba names a kernel's cache directory by its source file's directory: every fresh
    # clone compiled every kernel again (some 90 s of CPU here) until the kernels were
    # filed by their contents (minidp/kernels/locator.py).
    from minidp.kernels import jit

    if not jit.jit_enabled():
        pytest.skip("NUMBA_DISABLE_JIT=1: no kernel cache")
    package = os.path.dirname(os.path.dirname(jit.__file__))
    ignore = shutil.ignore_patterns("__pycache__")
    for day, name in enumerate(("first", "second", "edited")):
        shutil.copytree(package, tmp_path / name / "minidp", ignore=ignore)
        for source in (tmp_path / name / "minidp" / "kernels").glob("*.py"):
            os.utime(source, (86400 * day, 86400 * day))  # as a clone, files of another time
    edited = tmp_path / "edited" / "minidp" / "kernels" / "checksum.py"
    edited.write_text(edited.read_text() + "# an edit: these kernels are other kernels\n")
    got = {name: json.loads(run(CALLED_IN_A_COPY, COPY=str(tmp_path / name),
                                NUMBA_CACHE_DIR=str(tmp_path / "cache"), MINIDP_NUM_THREADS="1"))
           for name in ("first", "second", "edited")}
    for name, seen in got.items():
        assert seen["file"].startswith(str(tmp_path / name)), seen  # the copy ran, not this one
        assert seen["path"] == str(tmp_path / "cache" / "minidp-kernels"), seen
    assert (got["first"]["hits"], got["second"]["misses"]) == (0, 0), got
    assert got["first"]["misses"] > 0 and got["second"]["hits"] > 0, got
    assert (got["edited"]["hits"], got["edited"]["misses"] > 0) == (0, True), got


# Two kernel modules whose warm-ups each wait for the other's to have begun: only two
# processes filling the cache at once can finish them.
HANDSHAKE = """
import os, time
def warm(dtype):
    with open(LOG, "a") as f:
        f.write(f"{NAME} {dtype.__name__} {os.getpid()}\\n")
    open(os.path.join(DIR, NAME + ".began"), "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(DIR, OTHER + ".began")):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{NAME}: {OTHER} never began (filled one after the other)")
        time.sleep(0.02)
"""


def test_two_processes_fill_the_cache_at_once_each_module_once(tmp_path):
    from minidp.kernels import jit

    if not jit.jit_enabled():
        pytest.skip("NUMBA_DISABLE_JIT=1: no kernel cache")
    log = tmp_path / "calls.log"
    for name, other in (("alpha", "beta"), ("beta", "alpha")):
        (tmp_path / f"{name}.py").write_text(
            f"LOG, DIR, NAME, OTHER = {str(log)!r}, {str(tmp_path)!r}, {name!r}, {other!r}\n"
            + HANDSHAKE)
    code = ("import importlib.util, sys\n"
            "from minidp.kernels import jit\n"
            "warmups = []\n"
            "for name in ('alpha', 'beta'):\n"
            f"    spec = importlib.util.spec_from_file_location(name, {str(tmp_path)!r} + "
            "'/' + name + '.py')\n"
            "    module = importlib.util.module_from_spec(spec)\n"
            "    sys.modules[name] = module\n"
            "    spec.loader.exec_module(module)\n"
            "    warmups.append(module.warm)\n"
            "jit._warmups[:] = warmups\n"
            "jit.ensure_compiled()\n"
            "print(jit.cache_stamp())\n")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [proc.communicate(timeout=300) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    stamps = {out.strip() for out, _ in outputs}
    assert len(stamps) == 1 and os.path.exists(stamps.pop())
    calls = sorted(line.split() for line in log.read_text().splitlines())
    assert [c[:2] for c in calls] == [["alpha", "float32"], ["alpha", "float64"],
                                      ["beta", "float32"], ["beta", "float64"]]
    pids = {name: {pid for n, _, pid in calls if n == name} for name in ("alpha", "beta")}
    assert len(pids["alpha"]) == len(pids["beta"]) == 1 and pids["alpha"] != pids["beta"]


def test_malloc_tuning_applies_unless_turned_off():
    code = "from minidp import allocator; print(allocator.tune_malloc())"
    assert run(code) == "True"
    assert run(code, MINIDP_MALLOC_TUNING="0") == "False"
    assert run(code, MALLOC_MMAP_THRESHOLD_="100000", MALLOC_TRIM_THRESHOLD_="100000") == "False"


def test_guard_reads_its_variables_when_needed(monkeypatch):
    from minidp.comm import guard

    monkeypatch.setattr(guard, "_settings", {})
    monkeypatch.setenv("MINIDP_COMM_TIMEOUT", "5m")
    monkeypatch.setenv("MINIDP_DEBUG", "maybe")
    with pytest.raises(ValueError, match="MINIDP_COMM_TIMEOUT: got '5m', allowed: a number of "
                                         "seconds >= 1"):
        guard.comm_timeout()
    with pytest.raises(ValueError, match="MINIDP_DEBUG: got 'maybe', allowed: 0 or 1"):
        guard.debug_checks()
    monkeypatch.setenv("MINIDP_COMM_TIMEOUT", "inf")
    with pytest.raises(ValueError, match="MINIDP_COMM_TIMEOUT: got 'inf'"):
        guard.comm_timeout()
    monkeypatch.setenv("MINIDP_COMM_TIMEOUT", "12.5")
    monkeypatch.setenv("MINIDP_DEBUG", "1")
    assert (guard.comm_timeout(), guard.debug_checks()) == (12.5, True)
    guard.set_timeout(3)
    assert guard.comm_timeout() == 3.0
