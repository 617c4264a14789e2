#!/usr/bin/env python3
# Made tests/fixtures/tokenizer_ids.txt and tokenizer_ids_gpt2.txt with:
#   /root/refvenv/bin/python tools/make_tokenizer_fixture.py \
#       --model ~/.cache/streamsink/SmolLM2-135M-Instruct.Q4_1.gguf \
#       --corpus tests/fixtures/tokenizer_corpus.txt --out tests/fixtures/tokenizer_ids.txt
#   /root/refvenv/bin/python tools/make_tokenizer_fixture.py \
#       --model ~/.cache/streamsink/SmolLM2-135M-Instruct.Q4_1.gguf \
#       --corpus tests/fixtures/tokenizer_corpus.txt --pre gpt2 \
#       --out tests/fixtures/tokenizer_ids_gpt2.txt
# (needs: pip install gguf tokenizers numpy)
"""Golden token ids for engine/tokenizer.h, from Hugging Face `tokenizers`.

The reference tokenizer is built from the GGUF's own vocab and merges (read
with the `gguf` package), with the pre-tokenizer of SmolLM2's tokenizer.json:
Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False,
use_regex=True)], no normalizer, BPE without unk token, ByteLevel decoder.
It does not go through transformers' GGUF loader, which drops the digit split.
With --pre gpt2 the same vocab gets the plain GPT-2 pre-tokenizer (ByteLevel
alone), to check the engine's "gpt2" path on real merges.
Tokens of type CONTROL (3) become special added tokens, USER_DEFINED (4) plain
added tokens, as in the tokenizer.json the GGUF was converted from.

Cases: every paragraph of the corpus (paragraphs are separated by a line
"%%"), every line of every paragraph, the paragraphs again with special tokens
treated as text, the whole corpus, some hand-written edge cases and seeded
random strings over a mix of scripts, digits, whitespace and punctuation.

Output, one case per line after '#' comment lines:
    flags TAB hex(UTF-8 input) TAB space-separated ids
flags: 's' = special tokens were parsed (tok_encode parse_special=1),
       'r' = HF decodes the ids back to exactly the input, '-' = neither.
"""
import argparse
import os
import random
import sys

import gguf
import tokenizers
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers


TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4


def field_strs(reader, key):
    f = reader.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def field_ints(reader, key):
    f = reader.fields[key]
    return [int(f.parts[i][0]) for i in f.data]


def field_str(reader, key):
    f = reader.fields.get(key)
    return bytes(f.parts[f.data[0]]).decode("utf-8") if f else None


def build_tokenizer(path, pre_override=None):
    r = gguf.GGUFReader(path)
    model = field_str(r, "tokenizer.ggml.model")
    pre = pre_override or field_str(r, "tokenizer.ggml.pre")
    if model != "gpt2":
        sys.exit(f"{path}: tokenizer.ggml.model is {model!r}, not 'gpt2'")
    tokens = field_strs(r, "tokenizer.ggml.tokens")
    types = field_ints(r, "tokenizer.ggml.token_type")
    merges = field_strs(r, "tokenizer.ggml.merges")
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = []
    for m in merges:
        # The engine skips merges whose parts or result are not in the vocab;
        # HF would refuse them. Dropping them keeps the relative ranks.
        a, sep, b = m.partition(" ")
        if sep and a in vocab and b in vocab and a + b in vocab:
            pairs.append((a, b))
    if len(pairs) != len(merges):
        print(f"skipped {len(merges) - len(pairs)} merges", file=sys.stderr)

    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, unk_token=None, fuse_unk=False,
                               byte_fallback=False))
    if pre == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    elif pre in ("gpt2", "default", None):
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        sys.exit(f"{path}: no reference pre-tokenizer for tokenizer.ggml.pre={pre!r}")
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([
        AddedToken(tokens[i], special=True, normalized=False)
        for i, t in enumerate(types) if t == TOKEN_CONTROL
    ])
    tok.add_tokens([
        AddedToken(tokens[i], special=False, normalized=False)
        for i, t in enumerate(types) if t == TOKEN_USER_DEFINED
    ])
    return tok, pre


def corpus_cases(text, lines=True):
    paras = text.split("\n%%\n")
    cases = []
    for p in paras:
        cases.append((p, True))
        for line in p.split("\n") if lines else []:
            if line:
                cases.append((line, True))
    for p in paras:
        cases.append((p, False))
    cases.append(("\n\n".join(paras), True))
    return cases


EDGE_CASES = [
    "", " ", "  ", "\n", "\t", "a", "1", " 1", "  1", "a 1", "a  1", "a   b", "a \n b", "x\n\n\ny",
    "1234567890", "3.14159", "-0.5", "12 34  56   ", "1 2 3", "'s", " 's", "''s", "it's'", "don'T",
    "   trailing   ", "\t\tx", "x\t\t", "\r\n\r\n", " \u00a0 x", "\u3000x", "x\u0085y",
    "😀", " 😀", "👨‍👩‍👧", "🇺🇸🇯🇵", "e\u0301\u0301", " \u0301", "a\u0308b", "中文 中文",
    "<|im_start|>", "<|im_start|><|im_start|>", " <|im_end|> ", "<|im_start", "<<|im_end|>>",
    "<|endoftext|>text<|endoftext|>", "a\x04b\x06c\x13\x14\x16\x1d", "\x7f\x00\x01", "ÿ Ā",
    "a\x0bb\x0cc\x1cd\x1fe \x1c f\x1e", " \u2028x\u2029 y\u205f\u180e", "x  \u00a0\u00a0y", "½ ¼1 Ⅻ2",
]

FRAGMENTS = [
    "a", "Z", "the", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r", "1", "23", "456", "0",
    "'", "'s", "'t", "'re", "'ll", "'ve", "'m", "'d", ".", ",", "!", "?", "...", "--", "_", "-", "$",
    "é", "e\u0301", "\u0301", "Ω", "жук", "中", "文字", "😀", "👨‍👩‍👧", "🇺🇸", "❤️", "\u00a0",
    "\u2003", "\u200b", "\u0660", "½", "Ⅻ", "²", "ß", "İ", "ǅ", "ʰ", "<|im_start|>", "<|im_end|>",
    "<", "|", ">", "(", ")", "{", "}", "#", "//", "/*", "*/", "\\", "\"", "`", "~", "@", "٣", "१",
]


def random_cases(rng, n, special):
    out = []
    for _ in range(n):
        k = rng.randint(1, 24)
        out.append(("".join(rng.choice(FRAGMENTS) for _ in range(k)), special))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--pre", help="use this pre-tokenizer instead of tokenizer.ggml.pre")
    args = ap.parse_args()
    command = " ".join(["/root/refvenv/bin/python", "tools/make_tokenizer_fixture.py"] +
                       [a.replace(os.path.expanduser("~"), "~") for a in sys.argv[1:]])

    tok, pre = build_tokenizer(args.model, args.pre)
    with open(args.corpus, encoding="utf-8", newline="") as f:
        corpus = f.read()

    rng = random.Random(20240611)
    cases = corpus_cases(corpus, lines=args.pre is None)
    cases += [(s, True) for s in EDGE_CASES]
    cases += [(s, False) for s in EDGE_CASES if "<" in s]
    cases += random_cases(rng, 300, True)
    cases += random_cases(rng, 100, False)

    lines = [
        f"# {command}",
        f"# tokenizers {tokenizers.__version__}, pre={pre}: flags TAB hex(UTF-8 input) TAB ids; "
        "flags: s = parse special, r = HF decode round-trips",
    ]
    n_rt = 0
    for text, special in cases:
        tok.encode_special_tokens = not special
        ids = tok.encode(text, add_special_tokens=False).ids
        rt = tok.decode(ids, skip_special_tokens=False) == text
        n_rt += rt
        flags = ("s" if special else "") + ("r" if rt else "")
        lines.append(f"{flags or '-'}\t{text.encode('utf-8').hex()}\t{' '.join(map(str, ids))}")
    with open(args.out, "w", encoding="ascii", newline="\n") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{args.out}: {len(cases)} cases, {n_rt} round-trip", file=sys.stderr)


if __name__ == "__main__":
    main()
