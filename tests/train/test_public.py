"""``lt.train`` and ``lt.TrainResult`` resolve from the top level, whichever is imported first."""

import subprocess
import sys

import lazytrain_jax as lt


def test_train_and_result_are_public():
    assert callable(lt.train) and lt.TrainResult.__name__ == "TrainResult"
    assert {"train", "TrainResult"} <= set(dir(lt))


def test_train_callable_after_importing_the_subpackage_first():
    code = ("import lazytrain_jax.train.config, lazytrain_jax as lt, inspect; "
            "from lazytrain_jax.train.loop import train; "
            "assert callable(lt.train) and lt.train.TrainConfig is not None; "
            "sig = inspect.signature(train); assert 'checkpoint_dir' in sig.parameters")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
