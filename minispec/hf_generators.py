"""Hugging Face transformers' generation pipelines, as generator factories for
the judge's `--generator` (see minispec/generators.py for the signature).

    python -m minispec judge --generator minispec.hf_generators:assisted
    python -m minispec judge --generator minispec.hf_generators:prompt_lookup

Each loads the directories as a user would (AutoModelForCausalLM.from_pretrained, float32, on
the CPU) and calls `generate` with sampling, seeding torch before every call. top_k=0 is passed
explicitly: transformers' own default is 50. Needs torch and transformers; minispec itself
never imports this module.
"""

from __future__ import annotations

import importlib.util

from .errors import MinispecError

REQUIRES = ("torch", "transformers")  # verify_distribution checks these before calling


def _load(path):
    missing = [m for m in REQUIRES if importlib.util.find_spec(m) is None]
    if missing:
        raise MinispecError(f"minispec.hf_generators needs {' and '.join(missing)} "
                            "(pip install 'minispec[parity]')")
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)  # a few rows of a tiny model: one thread is fastest
    return torch, AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _generator(target, extra):
    torch, model = target

    def generate(prompt_ids, *, max_new_tokens, temperature, top_k, top_p, seed):
        x = torch.tensor([list(prompt_ids)])
        torch.manual_seed(seed)
        kw = ({"do_sample": True, "temperature": temperature, "top_k": top_k, "top_p": top_p}
              if temperature > 0 else {"do_sample": False})
        with torch.inference_mode():
            out = model.generate(x, attention_mask=torch.ones_like(x),
                                 max_new_tokens=max_new_tokens, pad_token_id=0, **kw, **extra)
        return out[0, x.shape[1]:].tolist()

    return generate


def sample(target_dir, draft_dir):
    """transformers' plain `generate(do_sample=True)`: no drafts, the reference."""
    return _generator(_load(target_dir), {})


def assisted(target_dir, draft_dir):
    """transformers' assisted generation: `generate(assistant_model=draft, do_sample=True)`."""
    return _generator(_load(target_dir), {"assistant_model": _load(draft_dir)[1]})


def prompt_lookup(target_dir, draft_dir):
    """transformers' prompt lookup decoding: `generate(prompt_lookup_num_tokens=3,
    do_sample=True)` (the draft directory is unused)."""
    return _generator(_load(target_dir), {"prompt_lookup_num_tokens": 3})
