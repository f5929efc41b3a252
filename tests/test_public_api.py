"""The public names users rely on resolve from the top-level package."""

import subprocess
import sys

import lazytrain_jax as lt

PUBLIC = ["ModelConfig", "PRESETS", "get_preset", "Model", "init_model", "load_model", "save_hf",
          "to_hf_state_dict", "forward", "loss_and_grad", "plan", "Plan", "Hardware"]


def test_public_names_resolve():
    for name in PUBLIC:
        assert callable(getattr(lt, name)) or name == "PRESETS", name
    assert callable(lt.optim.adamw_8bit)
    assert lt.plan.__module__ == "lazytrain_jax.schedule.api"
    assert set(PUBLIC) <= set(dir(lt))


def test_unknown_attribute_is_an_attribute_error():
    try:
        lt.no_such_thing
    except AttributeError as e:
        assert "no_such_thing" in str(e)
    else:
        raise AssertionError("expected AttributeError")


def test_importing_the_package_and_planning_imports_no_jax():
    code = ("import sys, lazytrain_jax as lt; p = lt.plan('qwen3-debug', 'rtx3090', batch_size=2, seq_len=32); "
            "assert p.predicted_step_time_s > 0; assert 'jax' not in sys.modules, 'jax imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
