"""python-mip's CBC functions are looked up before the first CBC model (``linear.bind_cbc``).

cffi looks a library's function up on first use under a lock the same thread cannot take twice; a
garbage collection inside such a lookup that frees a python-mip model runs its finaliser, whose
``Cbc_deleteModel`` lookup then waits on that lock for ever where no model was freed before (a
test process hung so in CBC's first in-process solve)."""

import subprocess
import sys
import textwrap

# A model left for the collector, then every later lookup under cffi's lock starts a collection
# (as an automatic one may); the automatic ones are held back so that none frees the model first.
# Without linear.bind_cbc this process waits for itself in its first solve's first lookup.
_SCRIPT = textwrap.dedent("""
    import gc, threading
    import mip
    from mip import cbc

    gc.disable()
    model = mip.Model(solver_name="CBC")
    model.cycle = model
    del model


    class CollectingLock:
        def __init__(self):
            self.lock = threading.Lock()

        def __enter__(self):
            self.lock.acquire()
            if gc.isenabled():
                gc.collect()

        def __exit__(self, *exc):
            self.lock.release()

        def acquire(self, *args):
            return self.lock.acquire(*args)

        def release(self):
            self.lock.release()


    cbc.ffi._lock = CollectingLock()
    from lazytrain_jax.schedule import linear, milp
    gc.set_threshold(10**9)
    gc.enable()
    m = milp._Model()
    v = m.add_var()
    m.objective = linear.minimize(v)
    solver = m.mip_model()
    solver.optimize()
    print("solved", solver.objective_value, "collector", gc.isenabled())
""")


def test_a_collection_inside_a_cbc_lookup_does_not_hang_the_solve():
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-4:] == ["solved", "0.0", "collector", "True"]


def test_every_cbc_function_is_looked_up_once_a_model_is_made():
    from mip import cbc

    from lazytrain_jax.schedule import milp
    milp._Model().mip_model()
    missing = [name for name in dir(cbc.cbclib) if name not in cbc.cbclib.__dict__]
    for name in missing:  # only names this build of the library lacks
        try:
            getattr(cbc.cbclib, name)
        except (AttributeError, OSError):
            continue
        raise AssertionError(f"{name} was not looked up")
