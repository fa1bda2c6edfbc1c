import os

import pytest
import torch

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

MODELS_YAML = os.environ.get("TREEGRAFT_MODELS_YAML")


@pytest.fixture(scope="session", autouse=True)
def load_each_pair_once():
    """Every loader in this run (the CLI's, the app's runtime, the fixtures below) shares one loaded copy per pair
    and dtype: the same real models, loaded once per test run instead of once per test. A pair that fails to load
    is not kept, so the load-failure tests still load for real."""
    from treegraft import models

    real, loaded = models.load_pair_models, {}

    def once(pair, dtype=None):
        key = (pair.model_dump_json(), str(models.pair_dtype(pair, dtype)))
        if key not in loaded:
            loaded[key] = real(pair, dtype)
        return loaded[key]

    models.load_pair_models = once
    yield
    models.load_pair_models = real


@pytest.fixture(scope="module", autouse=True)
def one_openmp_team_after_each_module():
    """After a module whose app ran the engine on its engine thread (ui/runtime.py), end that thread, so the tests
    after it run torch on the main thread alone: with a second thread's OpenMP team alive, every parallel region waits
    for its worker to wake (a verification ~1.5x as long on 2 cores)."""
    yield
    import sys

    runtime = sys.modules.get("ui.runtime")
    if runtime is not None:
        runtime.close_engine_thread()


@pytest.fixture(scope="session")
def fp32_pair():
    """The embedded default pair in float32, loaded once per test run."""
    from treegraft.config import DEFAULT_MODELS_YAML, load_pair
    from treegraft.models import load_pair_models

    torch.manual_seed(0)
    return load_pair_models(load_pair("default", MODELS_YAML or DEFAULT_MODELS_YAML), "float32")


@pytest.fixture(scope="session")
def lm_pair():
    """The same target with the earlier 4-layer mid LM (pair smollm2-lm), float32, loaded once."""
    from treegraft.config import DEFAULT_MODELS_YAML, load_pair
    from treegraft.models import load_pair_models

    return load_pair_models(load_pair("smollm2-lm", MODELS_YAML or DEFAULT_MODELS_YAML), "float32")


@pytest.fixture(scope="session")
def lm_engine(lm_pair):
    from treegraft.engine import Engine

    return Engine(lm_pair)


@pytest.fixture(scope="session")
def engine(fp32_pair):
    from treegraft.engine import Engine

    return Engine(fp32_pair)


@pytest.fixture(scope="session")
def tiny_engine():
    from tests.tiny import tiny_pair
    from treegraft.engine import Engine

    return Engine(tiny_pair())


@pytest.fixture(scope="session")
def tiny_head_engine():
    from tests.tiny import tiny_head_pair
    from treegraft.engine import Engine

    return Engine(tiny_head_pair())


@pytest.fixture(scope="session")
def load_script():
    """A loader of a script of scripts/ as a module, by name (their pure helpers are tested without a model)."""
    import importlib.util
    from pathlib import Path

    scripts = Path(__file__).resolve().parents[1] / "scripts"

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, scripts / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
