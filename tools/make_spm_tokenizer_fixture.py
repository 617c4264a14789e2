#!/usr/bin/env python3
# Made tests/fixtures/tokenizer_ids_gemma3.txt with:
#   /root/refvenv/bin/python tools/make_spm_tokenizer_fixture.py \
#       --model ~/.cache/streamsink/gemma-3-270m-q4_k_m.gguf \
#       --corpus tests/fixtures/tokenizer_corpus.txt --out tests/fixtures/tokenizer_ids_gemma3.txt
# (needs: pip install gguf sentencepiece protobuf transformers tokenizers torch)
"""Golden token ids for the SentencePiece path of engine/tokenizer.h (spm.c).

Two independent references, which must agree on every case (but one) or the
script stops:
  1. Google's `sentencepiece` library, running a BPE ModelProto rebuilt from
     the GGUF's tokens, scores and token types (byte_fallback on, identity
     normalizer, whitespace escaped as U+2581, add_dummy_prefix from
     tokenizer.ggml.add_space_prefix). The GGUF stores the whitespace-run
     tokens as real spaces ("  "); the original model spells them with U+2581,
     so those are spelled back. sentencepiece never matches CONTROL pieces in
     text, so with special-token parsing the text is first cut at CONTROL
     token strings here (leftmost, longest at that place).
  2. Hugging Face transformers' GGUF tokenizer loader
     (AutoTokenizer.from_pretrained(dir, gguf_file=...)), which rebuilds BPE
     merges from the vocabulary (tokenizers' BPE with byte fallback).
The one known difference: a run of more than 31 spaces, longer than the
longest space-run token. sentencepiece (and llama.cpp) match the run tokens
as user-defined pieces, longest first (32 spaces: 31 + 1); the loader turns
them into ordinary tokens reached by merges, which pair spaces up (16 + 16).
The fixture takes sentencepiece's ids there and lists each such case in a
comment line.

Cases: every paragraph and line of the corpus (paragraphs separated by a line
"%%"), the paragraphs again with special tokens treated as text, the whole
corpus, hand-written edge cases (whitespace runs longer than the longest run
token, tabs, newlines, digits, code, CJK, emoji, combining marks, characters
that need byte fallback, control and user-defined tokens) and seeded random
strings.

Output, one case per line after '#' comment lines, as tools/make_tokenizer_fixture.py:
    flags TAB hex(UTF-8 input) TAB space-separated ids
flags: 's' = special tokens were parsed (tok_encode parse_special=1),
       'r' = Hugging Face decodes the ids back to exactly the input, '-' = neither.
"""
import argparse
import os
import random
import re
import sys

import gguf
import sentencepiece
import tokenizers
import transformers
from sentencepiece import sentencepiece_model_pb2 as pb

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_BYTE = 1, 2, 3, 4, 6


def field(reader, key):
    f = reader.fields.get(key)
    return f.contents() if f else None


def build_sentencepiece(r):
    tokens = field(r, "tokenizer.ggml.tokens")
    scores = field(r, "tokenizer.ggml.scores")
    types = field(r, "tokenizer.ggml.token_type")
    unk = field(r, "tokenizer.ggml.unknown_token_id")
    prefix = field(r, "tokenizer.ggml.add_space_prefix")
    m = pb.ModelProto()
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.vocab_size = len(tokens)
    m.trainer_spec.byte_fallback = True
    m.trainer_spec.unk_id = unk
    m.trainer_spec.bos_id = field(r, "tokenizer.ggml.bos_token_id")
    m.trainer_spec.eos_id = field(r, "tokenizer.ggml.eos_token_id")
    m.trainer_spec.pad_id = field(r, "tokenizer.ggml.padding_token_id")
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = bool(prefix) if prefix is not None else True
    m.normalizer_spec.remove_extra_whitespaces = False
    m.normalizer_spec.escape_whitespaces = True
    for i, (t, s, ty) in enumerate(zip(tokens, scores, types)):
        p = m.pieces.add()
        if ty == TOKEN_USER_DEFINED and t and not t.strip(" "):
            t = "\u2581" * len(t)  # the original spelling of a run of spaces
        p.piece = t
        p.score = s
        # sentencepiece wants its one unknown piece typed UNKNOWN; GGUF says CONTROL
        p.type = TOKEN_UNKNOWN if i == unk else ty
    sp = sentencepiece.SentencePieceProcessor(model_proto=m.SerializeToString())
    controls = [(t, i) for i, (t, ty) in enumerate(zip(tokens, types))
                if ty == TOKEN_CONTROL and t]
    return sp, controls


def sp_encode(sp, controls, text, special):
    """sentencepiece ids, the text first cut at CONTROL strings when special."""
    if not special:
        return sp.encode(text)
    ids = []
    i = start = 0
    while i < len(text):
        best = None
        for t, tid in controls:
            if text.startswith(t, i) and (best is None or len(t) > len(best[0])):
                best = (t, tid)
        if best:
            ids += sp.encode(text[start:i]) + [best[1]]
            i = start = i + len(best[0])
        else:
            i += 1
    return ids + sp.encode(text[start:])


def corpus_cases(text):
    paras = text.split("\n%%\n")
    cases = []
    for p in paras:
        cases.append((p, True))
        for line in p.split("\n"):
            if line:
                cases.append((line, True))
    for p in paras:
        cases.append((p, False))
    cases.append(("\n\n".join(paras), True))
    return cases


EDGE_CASES = [
    "", " ", "  ", "   ", " " * 31, " " * 32, " " * 45, " " * 70, "\n", "\n" * 31, "\n" * 40,
    "\t", "\t" * 31, "\t" * 33, " \t \t", "\t \n \t", "a", "1", "12", "1234567890", " 1", "3.14159",
    "-0.5", "12 34  56   ", "a  b", "a   b", "a \n b", "x\n\n\ny", "\r\n\r\n", "   trailing   ",
    "\t\tx", "x\t\t", " \u00a0 x", "\u3000x", "x\u0085y", "😀", " 😀", "👨‍👩‍👧", "🇺🇸🇯🇵",
    "e\u0301\u0301", " \u0301", "a\u0308b", "中文 中文", "日本語のテキスト、漢字とかな。",
    "한국어 문장입니다", "Ελληνικά και русский", "مرحبا بالعالم", "नमस्ते दुनिया",
    "𠀀𠀁𪚥", "\U000e0041\U000f0000\U0010fffd", "\ue000\uf8ff", "\x00\x01\x02\x7f", "a\x04b\x1fc",
    "\U0001fae8\U0001fa77", "ﬁ ﬀ ℌ ①", "½ ¼1 Ⅻ2", "x\u200by\u200dz\ufeff",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", "<bos>", "<eos><pad><unk>",
    "<start_of_turn", "<<start_of_turn>>", "<unused0><unused6241>", "<mask>[multimodal]",
    "<table><tr><td>1</td></tr></table>", "<h1>Title</h1><b>bold</b>", "<start_of_image>",
    "def f(x):\n    return x**2  # square\n", "if (a && b) { return -1; }\n\tfoo();",
    "int main(void)\n{\n\treturn 0;\n}\n", "https://example.com/a?b=1&c=2#d", "foo_bar-baz.qux",
    "\u2581", "\u2581\u2581 x", "▁hello", "hello\u2581world",
]

FRAGMENTS = [
    "a", "Z", "the", " ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", "1", "23",
    "456", "0", "'", "'s", ".", ",", "!", "?", "...", "--", "_", "-", "$", "é", "e\u0301", "\u0301",
    "Ω", "жук", "中", "文字", "😀", "👨‍👩‍👧", "🇺🇸", "❤️", "\u00a0", "\u2003", "\u200b", "\u0660",
    "½", "Ⅻ", "²", "ß", "İ", "ǅ", "ʰ", "<start_of_turn>", "<end_of_turn>", "<bos>", "<", "|",
    ">", "(", ")", "{", "}", "#", "//", "/*", "*/", "\\", "\"", "`", "~", "@", "٣", "१", "𪚥",
    "\U000f0001", "\x01", "<b>", "</td>", "\u2581", "token", "izer", "ing", " of", "ation",
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
    args = ap.parse_args()
    command = " ".join(["/root/refvenv/bin/python", "tools/make_spm_tokenizer_fixture.py"] +
                       [a.replace(os.path.expanduser("~"), "~") for a in sys.argv[1:]])

    r = gguf.GGUFReader(args.model)
    if field(r, "tokenizer.ggml.model") != "llama":
        sys.exit(f"{args.model}: tokenizer.ggml.model is not 'llama'")
    sp, controls = build_sentencepiece(r)
    hf = transformers.AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(args.model)),
                                                    gguf_file=os.path.basename(args.model))
    with open(args.corpus, encoding="utf-8", newline="") as f:
        corpus = f.read()

    rng = random.Random(20261201)
    cases = corpus_cases(corpus)
    cases += [(s, True) for s in EDGE_CASES]
    cases += [(s, False) for s in EDGE_CASES if "<" in s]
    cases += random_cases(rng, 300, True)
    cases += random_cases(rng, 100, False)

    lines = [
        f"# {command}",
        f"# sentencepiece {sentencepiece.__version__} == transformers {transformers.__version__} "
        f"(tokenizers {tokenizers.__version__}) GGUF loader on every case: flags TAB "
        "hex(UTF-8 input) TAB ids; flags: s = parse special, r = HF decode round-trips",
    ]
    n_rt = 0
    n_bad = 0
    for text, special in cases:
        ids = sp_encode(sp, controls, text, special)
        hf_ids = hf.encode(text, add_special_tokens=False, split_special_tokens=not special)
        if ids != hf_ids:
            known = re.search(" {32,}", text) is not None
            n_bad += not known
            print(f"references differ{' (known)' if known else ''} on {text!r} "
                  f"(special={special}):\n  sp {ids}\n  hf {hf_ids}", file=sys.stderr)
            if known:
                lines.append(f"# HF differs on {text.encode('utf-8').hex()}: {hf_ids}")
        rt = hf.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) == text
        n_rt += rt
        flags = ("s" if special else "") + ("r" if rt else "")
        lines.append(f"{flags or '-'}\t{text.encode('utf-8').hex()}\t{' '.join(map(str, ids))}")
    if n_bad:
        sys.exit(f"the two references differ on {n_bad} of {len(cases)} cases: no fixture written")
    with open(args.out, "w", encoding="ascii", newline="\n") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{args.out}: {len(cases)} cases, {n_rt} round-trip", file=sys.stderr)


if __name__ == "__main__":
    main()
