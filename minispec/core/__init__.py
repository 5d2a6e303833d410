"""The lesson: speculative decoding for one sequence, in the order to read it.

    model.py        the transformer forward pass (NumPy or CuPy through `xp`) and its KV cache
    sampling.py     logits -> probabilities (temperature, top-k, top-p) -> one token
    verify.py       the speculative step: keep each draft with min(1, p/q), else resample
    drafter.py      the drafter contract, and the drafter of the paper: a smaller model
    speculative.py  one round (draft, one target call, verify) and the loop around it

    checks.py       every argument and every drafter's output checked (the lesson reads without it)

These files import nothing of minispec above them, only the layer below (config, rope_scaling,
backend, errors): trees, batches, the other drafters, CUDA graphs, the judge and the benchmarks
extend the core from outside (tests/test_core.py checks it).
"""
