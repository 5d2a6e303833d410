"""Shared fixtures: the repository on sys.path, the device parameter, tiny model configs."""

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
