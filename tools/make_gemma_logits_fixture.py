#!/usr/bin/env python3
"""Reference logits for Gemma 3 270M, from Hugging Face transformers.

transformers loads the GGUF file (dequantizing every weight, Q4_K/Q5_0/Q6_K/
Q8_0, to float32; its Gemma tensor processor subtracts the 1 that the GGUF's
norm weights carry) and runs its own Gemma3ForCausalLM forward in float32,
with eager attention. The fixture has the same format as
tests/fixtures/logits_smollm2.txt (tools/make_logits_fixture.py): for each
prompt the token ids and, at every position, the top-k (id, logit) pairs.

The last prompt is longer than the 512-token sliding window, so from position
512 on the local layers (5 of every 6) see only the last 512 keys while the
global ones see them all: a forward that ignores the window, or applies it to
every layer, moves those logits.

Token ids come from transformers' GGUF tokenizer with BOS prepended, as Gemma
expects (tokenizer.ggml.add_bos_token); tests/fixtures/tokenizer_ids_gemma3.txt
tests the tokenizer itself.

Made with (the venv needs torch, transformers, gguf):
    /root/refvenv/bin/python tools/make_gemma_logits_fixture.py \
        --model ~/.cache/streamsink/gemma-3-270m-q4_k_m.gguf --out tests/fixtures/logits_gemma3.txt
"""
import argparse
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

LONG = (
    "The lighthouse stood at the end of a narrow spit of rock, and for most of the year the "
    "only people who came near it were the keeper and the men who brought his supplies. "
    "The keeper was a quiet man named Tobias, who had taken the post after the war because he "
    "wanted a place where nothing would ask him questions. Every evening he climbed the one "
    "hundred and twelve steps to the lamp room, trimmed the wick, polished the great lens, and "
    "wrote a line in the log: the weather, the ships he had seen, the state of the sea. "
    "In the spring the gulls returned and nested in the cracks of the cliff below, and their "
    "crying woke him before dawn. In the summer the fog rolled in from the west and sat on the "
    "water for days, so thick that he had to sound the horn every half minute through the night. "
    "In the autumn the storms came, one after another, and the waves broke so high against the "
    "tower that salt crusted the windows of the lamp room and he had to scrape it away by hand. "
    "In the winter the light was all that mattered, because the nights were long and the "
    "fishing boats went out in the dark and came back in the dark, and every captain on that "
    "coast knew the rhythm of the beam: three long flashes and one short, every twenty seconds. "
    "One November night, when the wind had been blowing for three days without a pause, "
    "Tobias saw a small light bobbing on the water to the south, far from where any boat "
    "should have been. He watched it through the glass for a long time. It moved toward the "
    "reef, then away, then toward it again, as if whoever held it could not decide which way "
    "to go. He knew the reef well. At low tide it showed its teeth, a long black line of rock "
    "that had torn open the hulls of more ships than anyone could count. At high tide it hid "
    "under a skin of white water, and that was when it was most dangerous. The tide was rising. "
    "He went down the stairs two at a time, pulled on his oilskins, and ran to the shed where "
    "the little rowing boat was kept. The wind tore at the door as he opened it. He dragged "
    "the boat down the slipway and pushed it into the black water, and the first wave nearly "
    "threw it back onto the stones. He rowed with his back to the light, looking over his "
    "shoulder every few strokes to find the small glow again. Sometimes it disappeared behind "
    "the swell and he thought it was gone for good; then it would rise again, closer each time. "
    "When he reached it at last he found an open boat, half full of water, with a woman at the "
    "oars and two children huddled in the bow under a sodden blanket. The woman had tied a "
    "lantern to the mast with a strip of her own skirt. She did not say anything when he came "
    "alongside. She only looked at him, and then at the lighthouse, and then back at him, and "
    "he understood that she had been rowing toward the beam for hours without knowing whether "
    "anyone would see her. He took the children into his boat first, then helped her across, "
    "and tied her boat to his stern. The row back took twice as long, against the wind and the "
    "tide, and by the time they reached the slipway his hands were bleeding and he could no "
    "longer feel his arms. He carried the children up to the keeper's cottage one at a time, "
    "lit the stove, and wrapped them in every blanket he owned. The woman sat by the fire and "
    "shook, and when she finally spoke it was in a language he did not know. It did not matter. "
    "He made tea, and she drank it, and the children slept. In the morning the storm had passed "
    "and the sea was flat and grey and innocent, as if nothing had happened. Tobias climbed the "
    "one hundred and twelve steps, put out the lamp, and wrote in the log: wind north-west, "
    "falling; sea moderate; one boat, three souls, brought in safe. Then he sat for a long "
    "while at the top of the tower, looking out at the reef, and thought about how"
)

PROMPTS = [
    "The capital of France is",
    "<start_of_turn>user\nWhat is the tallest mountain on Earth?<end_of_turn>\n"
    "<start_of_turn>model\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Les fleurs du jardin sont très belles en été, et les enfants jouent dehors jusqu'au soir.",
    LONG,
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
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    c = model.config
    lines = [
        "# reference logits: Hugging Face transformers %s (torch %s), float32, eager attention, "
        "from %s" % (transformers.__version__, torch.__version__, f),
        "# made by: /root/refvenv/bin/python tools/make_gemma_logits_fixture.py --model <path to %s>"
        " --out %s" % (f, args.out),
        "# config: layers %d, hidden %d, heads %d/%d, head_dim %d, ffn %d, sliding_window %s, "
        "layer_types %s, rope %s, query_pre_attn_scalar %s, final_logit_softcapping %s, "
        "rms_norm_eps %g" % (c.num_hidden_layers, c.hidden_size, c.num_attention_heads,
                             c.num_key_value_heads, c.head_dim, c.intermediate_size,
                             c.sliding_window,
                             "".join("L" if t == "sliding_attention" else "G"
                                     for t in c.layer_types),
                             getattr(c, "rope_parameters", None), c.query_pre_attn_scalar,
                             c.final_logit_softcapping, c.rms_norm_eps),
        "# format: 'prompt N' then 'ids ...' then N lines 'pos P top id:logit ...' (top %d)" % TOPK,
    ]
    for text in PROMPTS:
        ids = tok(text, add_special_tokens=True).input_ids
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]
        greedy = tok.decode([int(logits[-1].argmax())])
        print("%d tokens, next %r" % (len(ids), greedy), file=sys.stderr)
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
