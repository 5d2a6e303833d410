"""Judge a verify step of your own with minispec's statistical judge.

A verify step takes the target's rows p [g+1, V], the draft's rows q [g, V], the g draft tokens
and a numpy Generator, and returns the tokens the round emits: the accepted drafts, then one
correction (or bonus) token. The judge calls it on fixed p and q many times and compares what
comes out with the exact law (G-tests); it shows its tests can tell by running them on broken
samplers of its own too (the controls). Below: Leviathan et al. 2023, Algorithm 1, written out
(my_verify), and the same with one line broken (broken_verify). From the command line:

    python -m minispec judge --sampler judge_my_verify:my_verify --quick   # from this folder
    python judge_my_verify.py                                              # both, a few seconds
"""

import contextlib
import io
import sys

import numpy as np

from minispec.judge import main as run_judge


def my_verify(p, q, draft_tokens, rng):
    """Keep draft x with probability min(1, p(x)/q(x)); resample the first rejected one from
    norm(max(0, p - q)); when all are kept, add a bonus token from p[g]."""
    out = []
    for i, x in enumerate(int(t) for t in draft_tokens):
        if rng.random() < min(1.0, p[i, x] / q[i, x]):
            out.append(x)
            continue
        r = np.maximum(p[i] - q[i], 0.0)
        out.append(int(rng.choice(len(r), p=r / r.sum())))
        return out
    out.append(int(rng.choice(p.shape[1], p=p[-1])))
    return out


def broken_verify(p, q, draft_tokens, rng):
    """my_verify with one line broken: a rejected draft is resampled from p, not the residual
    (the rejected token comes back too often: the output is not the target's law)."""
    out = []
    for i, x in enumerate(int(t) for t in draft_tokens):
        if rng.random() < min(1.0, p[i, x] / q[i, x]):
            out.append(x)
            continue
        r = p[i]  # the bug
        out.append(int(rng.choice(len(r), p=r / r.sum())))
        return out
    out.append(int(rng.choice(p.shape[1], p=p[-1])))
    return out


def judge(fn) -> tuple[int, str]:
    """Run `python -m minispec judge --sampler MODULE:FN --quick` in this process -> (exit status:
    0 PASS, 1 FAIL; the report). This module is already imported, under __name__ ("__main__"
    when run as a script), so the judge finds fn wherever this file was copied."""
    report = io.StringIO()
    with contextlib.redirect_stdout(report), contextlib.redirect_stderr(io.StringIO()):
        status = run_judge(["--sampler", f"{__name__}:{fn.__name__}", "--quick"])
    return status, report.getvalue()


def main() -> int:
    ok = True
    for fn, expected in ((my_verify, 0), (broken_verify, 1)):
        status, report = judge(fn)
        verdict = [line for line in report.splitlines() if line.startswith(("PASS", "FAIL"))]
        failed = [line for line in report.splitlines() if line.endswith("FAIL")]
        print(f"{fn.__name__}: {verdict[-1] if verdict else report.strip()[-300:]}")
        for line in failed[:3]:  # where a broken step shows
            print(f"    {' '.join(line.split())}")
        ok &= status == expected
    print("as expected" if ok else "NOT as expected: my_verify should PASS, broken_verify FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
