#!/usr/bin/env bash
# SmolLM2-135M-Instruct's EAGLE head and Medusa heads trained on a GPU (weights/README.md, "Heads
# trained on a GPU"): data made there in large batches, then train_heads.py with --device cuda.
# Run from the repository root on a machine with CUDA, torch and transformers:
#
#   MODE=smoke TOKENIZER=tok.json bash weights/gpu_heads.sh   # a tiny random Llama with
#                                                             # SmolLM2's tokenizer: checks the
#                                                             # script on the device, ~30 s
#   GGUF=SmolLM2-135M-Instruct.Q4_1.gguf bash weights/gpu_heads.sh   # the real run
#
# The real run converts the GGUF with minispec (the gguf package must import: WHEELS=DIR installs
# the wheels in DIR first), writes the heads to $OUT/eagle and $OUT/medusa (default ./gpu-heads)
# and its log to $OUT/heads.log. GEN_S, EAGLE_S, MEDUSA_S: the seconds given to generation and to
# each head's training; SEQS the prompts made (more than GEN_S can use); SEED; INIT_EAGLE and
# INIT_MEDUSA the heads to start from (default the shipped ones). The defaults are run I's
# (weights/README.md); runs J, K and L each continued the head before with fresh data (run K:
# SEQS=40000 SEED=13 GEN_S=230 EAGLE_S=160 MEDUSA_S=10; the shipped EAGLE head is run L's, the
# Medusa heads run K's). The GGUF (98 MB) crosses to a lent machine in two parts (its calls carry
# 64 MiB): copy the first to /tmp in the call that carries it (a warm machine keeps /tmp, not an
# ignored folder the next call does not name), and join them there with cat.
set -eu -o pipefail
OUT=${OUT:-gpu-heads}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
if [ -n "${WHEELS:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$WHEELS"/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__)"
if [ "${MODE:-real}" = smoke ]; then
    python3 weights/tiny_llama.py "$TOKENIZER" /tmp/tiny-llama
    python3 weights/train_heads.py --target /tmp/tiny-llama --device cuda --data mix --seqs 600 \
        --new-tokens 16 --eval-seqs 8 --gen-batch 64 --gen-seconds 10 --max-prompt-tokens 192 \
        --feature-batch 64 --draft-vocab 512 --batch 32 --eagle-epochs 50 --eagle-seconds 5 \
        --medusa-epochs 50 --medusa-seconds 3 --ttt 4 --out-eagle /tmp/smoke-eagle \
        --out-medusa /tmp/smoke-medusa 2>&1 | grep -v "step \|rank \|Loading"
    python3 -c "import gguf, minispec.convert, minispec.real; print('gguf', gguf.__file__)"
    exit
fi
SMOL=/tmp/smollm2-135m-instruct
python3 -c "from minispec.real import converted; converted('$GGUF', '$SMOL')"
python3 weights/train_heads.py --target "$SMOL" --device cuda --data mix --seqs "${SEQS:-40000}" \
    --new-tokens 160 --gen-batch 1024 --gen-seconds "${GEN_S:-140}" --max-prompt-tokens 192 \
    --eval-seqs 48 --feature-batch 64 --draft-vocab 8192 --batch 64 \
    --init-eagle "${INIT_EAGLE:-weights/smollm2/eagle}" --eagle-epochs 20 \
    --eagle-seconds "${EAGLE_S:-90}" \
    --eagle-lr 7e-4 --ce 0.5 --ttt 4 --reg 0.1 \
    --init-medusa "${INIT_MEDUSA:-weights/smollm2/medusa}" --medusa-epochs 20 \
    --medusa-seconds "${MEDUSA_S:-20}" \
    --medusa-lr 1e-3 --seed "${SEED:-11}" --out-eagle "$OUT/eagle" --out-medusa "$OUT/medusa" \
    2>&1 | grep --line-buffered -v "Loading weights" | tee "$OUT/heads.log"
