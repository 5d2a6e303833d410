"""Outside generator factories for tests/test_verify_distribution.py (`--generator`): one with a
planted pipeline bug, one that returns the wrong number of tokens, one needing a package that is
not installed."""

from minispec.judge.pipeline import broken_generator

REQUIRES: tuple[str, ...] = ()

greedy_draft = broken_generator("greedy draft")  # transformers #32867, on minispec's loop


def too_short(target_dir, draft_dir):
    def generate(prompt_ids, *, max_new_tokens, temperature, top_k, top_p, seed):
        return [0] * (max_new_tokens - 1)

    return generate
