"""The price of a tree's verify call on the GPU: one target call over the last context token
and a tree of each shape (minispec.tree.hidden_tree, then the head), over one token, with the
plain path and with CUDA graphs (a tree call of up to 16 rows replays a graph), on the shipped
target (float32) and a 1B Llama-shaped model (float16).

    python .ci/gpu_tree.py [DIR]      # DIR: the 1B checkpoint (written if absent; /tmp/llama1b)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from minispec import cuda_graphs  # noqa: E402
from minispec.loader import load  # noqa: E402
from minispec.measure import roofline  # noqa: E402
from minispec.measure.drafters import tree_costs  # noqa: E402
from minispec.shipped import shipped_dir  # noqa: E402

SHAPES = ((1, 1, 1, 1), (2, 2, 1, 1), (3, 2, 1, 1), (3, 3, 2, 1))
big = roofline.write_random_llama(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/llama1b"))
for name, path, dtype in [("shipped target", shipped_dir() / "target", "float32"),
                          ("1B Llama", big, "float16")]:
    model = load(path, device="gpu", dtype=dtype)
    for graphs in (False, True):
        if graphs:
            cuda_graphs.enable(model)
        rows = tree_costs(model, SHAPES, repeats=20)
        one = rows[0]["one_token_s"]
        print(f"{name}, {dtype}, {'CUDA graphs' if graphs else 'plain'}: one token "
              f"{one * 1e3:.3f} ms; " + "; ".join(
                  f"{r['shape']} ({r['nodes']} nodes) {r['tree_over_one_token']:.2f}"
                  for r in rows), flush=True)
        cuda_graphs.disable(model)
    del model
