#!/usr/bin/env python3
"""Reference logits for the engine, from Hugging Face transformers.

transformers loads the same GGUF file (dequantizing every weight to float32)
and runs its own Llama forward in float32. For each prompt the fixture keeps
the token ids and, at every position, the top-k (id, logit) pairs. The C test
(tests/unit/test_reference_logits.c) feeds the same ids and checks the greedy
token at every position and the logit differences.

Token ids come from transformers' GGUF tokenizer; they are inputs here, not
what is tested (tests/fixtures/tokenizer_ids.txt tests the tokenizer), and the
prompts avoid digits, where that tokenizer differs from the model's.

Made with (the venv needs torch, transformers, accelerate, gguf):
    python tools/make_logits_fixture.py --model ~/.cache/streamsink/SmolLM2-135M-Instruct.Q4_1.gguf \
        --out tests/fixtures/logits_smollm2.txt
"""
import argparse
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = [
    "The capital of France is",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    "What is the tallest mountain on Earth?<|im_end|>\n<|im_start|>assistant\n",
    "def fibonacci(n):\n    if n < two:\n        return n\n    return",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old "
    "woodcutter and his wife. They were poor, but they were kind, and every evening they shared "
    "what little bread they had with the birds that came to their window. One winter, when the "
    "snow lay deep on the ground and the river had frozen solid, a stranger knocked at their "
    "door. He was tall and thin, and his cloak was covered in frost. The woodcutter opened the "
    "door and invited him to sit by the fire, and his wife brought him a bowl of soup. The "
    "stranger ate in silence, and when he had finished, he looked at them with bright eyes and "
    "said that he had been walking for many days through the forest, and that",
    "Les fleurs du jardin sont très belles en été, et les enfants jouent dehors jusqu'au soir.",
]
TOPK = 16


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    d, f = os.path.split(os.path.abspath(args.model))
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    model.eval()
    lines = [
        "# reference logits: Hugging Face transformers %s (torch %s), float32, from %s"
        % (transformers.__version__, torch.__version__, f),
        "# made by: python tools/make_logits_fixture.py --model <path to %s> --out %s"
        % (f, args.out),
        "# format: 'prompt N' then 'ids ...' then N lines 'pos P top id:logit ...' (top %d)" % TOPK,
    ]
    for text in PROMPTS:
        ids = tok(text, add_special_tokens=False).input_ids
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]
        lines.append("prompt %d" % len(ids))
        lines.append("ids " + " ".join(str(i) for i in ids))
        for p in range(len(ids)):
            v, ix = logits[p].topk(TOPK)
            lines.append(
                "pos %d top " % p
                + " ".join("%d:%.6f" % (int(i), float(x)) for x, i in zip(v, ix))
            )
    with open(args.out, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("wrote", args.out, file=sys.stderr)


if __name__ == "__main__":
    main()
