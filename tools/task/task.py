#!/usr/bin/env python3
"""The synthetic task the default model is trained on, and its tokenizer.

Four kinds of problem, each with one exact answer, in plain text:

  reverse <letters>        reverse hello         -> olleh      4..48 letters
  sort <digits>            sort 93715            -> 13579      4..48 digits
  add <a>+<b>              add 4821+933          -> 5754       1..6 digits each
  get <k> <k=v,...>        get c a=17,b=42,c=99  -> 99         3..8 pairs, 1..4 digits

A reversed or sorted sequence of 32 or more characters does not fit one
canvas of 32 (the answer and its <eos>), so those answers span two canvases.

The tokenizer is character level: the layout of dgemma's synthetic
tokenizer (lib/tokenizer-synth.c: ten special ids, 256 byte-fallback ids,
"\u2581" for a space, then the printable ASCII characters) with no merges,
padded with unused ids to VOCAB.  A prompt's ids are therefore
[<bos>] + one id per character, and answers decode character by character.

Held-out problems are kept out of training by construction: a prompt whose
hash (`reserved`, over its token ids) is 0 modulo HOLDOUT_MOD belongs to the
evaluation set, and the training sampler drops every such prompt.

usage:
  task.py tokenizer OUTDIR          write tokenizer.json and tokenizer_config.json
  task.py heldout N SEED OUT.jsonl  write N held-out problems (tasks in turn)
  task.py check FILE.jsonl          recompute every answer in a problems file
"""

import json
import os
import random
import sys

VOCAB = 384
CANVAS = 32
N_SPECIAL = 10
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|turn>", "<turn|>", "<|think|>",
            "<|channel>", "<channel|>"]
NOT_SPECIAL = {"<mask>"}          # as in Gemma: <mask> is an ordinary added token
PAD, EOS, BOS = 0, 1, 2
SPACE = "\u2581"
FIRST_CHAR = N_SPECIAL + 256      # the id of the space piece; printable ASCII follows
HOLDOUT_MOD = 8
HASH_P = 1_000_003

TASKS = ("reverse", "sort", "add", "get")
LETTERS = "abcdefghijklmnopqrstuvwxyz"
DIGITS = "0123456789"
# the sizes drawn (inclusive ranges); tools/train/train.py draws the same
REVERSE_LEN = (4, 48)
SORT_LEN = (4, 48)
ADD_DIGITS = (1, 6)
GET_PAIRS = (3, 8)
GET_WIDTH = (1, 4)


def pieces():
    """Every piece of the vocabulary, in id order."""
    p = list(SPECIALS)
    p += ["<0x%02X>" % b for b in range(256)]
    p.append(SPACE)
    p += [chr(c) for c in range(0x21, 0x7F)]
    p += ["<unused%d>" % i for i in range(VOCAB - len(p))]
    assert len(p) == VOCAB
    return p


def char_id(c):
    """The id of one printable ASCII character or the space."""
    if c == " ":
        return FIRST_CHAR
    o = ord(c)
    if not 0x21 <= o < 0x7F:
        raise ValueError("task text holds %r, outside printable ASCII" % c)
    return FIRST_CHAR + 1 + (o - 0x21)


def encode(text, bos=True):
    return ([BOS] if bos else []) + [char_id(c) for c in text]


def decode(ids):
    """Text of ids up to the first <eos> (pads and specials dropped)."""
    out = []
    for i in ids:
        if i == EOS:
            break
        if i == FIRST_CHAR:
            out.append(" ")
        elif FIRST_CHAR < i < FIRST_CHAR + 95:
            out.append(chr(0x21 + i - FIRST_CHAR - 1))
    return "".join(out)


def prompt_hash(ids):
    """Hash of a prompt's ids (with <bos>); the training sampler computes
    the same in torch (tools/train/train.py)."""
    h = 0
    for i in ids:
        h = (h * 31 + i) % HASH_P
    return h


def reserved(prompt):
    return prompt_hash(encode(prompt)) % HOLDOUT_MOD == 0


def solve(prompt):
    """The answer of a prompt, computed from its text alone."""
    kind, _, arg = prompt.partition(" ")
    if kind == "reverse":
        return arg[::-1]
    if kind == "sort":
        return "".join(sorted(arg))
    if kind == "add":
        a, b = arg.split("+")
        return str(int(a) + int(b))
    if kind == "get":
        key, _, pairs = arg.partition(" ")
        for kv in pairs.split(","):
            k, v = kv.split("=")
            if k == key:
                return v
        raise ValueError("get: no key %r in %r" % (key, prompt))
    raise ValueError("unknown task in %r" % prompt)


def number(rng, ndig):
    if ndig == 1:
        return str(rng.randrange(10))
    return str(rng.randrange(1, 10)) + "".join(rng.choice(DIGITS) for _ in range(ndig - 1))


def sample(rng, kind):
    """One prompt of a kind, sizes drawn as the training sampler draws them."""
    if kind == "reverse":
        return "reverse " + "".join(rng.choice(LETTERS) for _ in range(rng.randint(*REVERSE_LEN)))
    if kind == "sort":
        return "sort " + "".join(rng.choice(DIGITS) for _ in range(rng.randint(*SORT_LEN)))
    if kind == "add":
        return "add %s+%s" % (number(rng, rng.randint(*ADD_DIGITS)),
                              number(rng, rng.randint(*ADD_DIGITS)))
    if kind == "get":
        n, width = rng.randint(*GET_PAIRS), rng.randint(*GET_WIDTH)
        keys = rng.sample(LETTERS, n)
        pairs = ",".join("%s=%s" % (k, "".join(rng.choice(DIGITS) for _ in range(width)))
                         for k in keys)
        return "get %s %s" % (rng.choice(keys), pairs)
    raise ValueError(kind)


def heldout(n, seed):
    """n distinct reserved problems, the tasks in turn."""
    rng = random.Random(seed)
    seen, out = set(), []
    while len(out) < n:
        kind = TASKS[len(out) % len(TASKS)]
        p = sample(rng, kind)
        if p in seen or not reserved(p):
            continue
        seen.add(p)
        out.append({"id": len(out) + 1, "task": kind, "prompt": p, "answer": solve(p)})
    return out


def write_tokenizer(outdir):
    p = pieces()
    added = []
    for i, piece in enumerate(p):
        special = i < N_SPECIAL and piece not in NOT_SPECIAL
        if i < N_SPECIAL or piece.startswith("<unused"):
            added.append({"id": i, "content": piece, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": special})
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": SPACE},
        "pre_tokenizer": {"type": "Split", "pattern": {"String": " "},
                          "behavior": "MergedWithPrevious", "invert": False},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<bos>", "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [BOS], "tokens": ["<bos>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": {piece: i for i, piece in enumerate(p)}, "merges": []},
    }
    cfg = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<bos>",
           "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
           "model_max_length": 8192, "tokenizer_class": "GemmaTokenizer"}
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(outdir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
        f.write("\n")


def check(path):
    bad = 0
    with open(path) as f:
        for n, line in enumerate(f, 1):
            pr = json.loads(line)
            if solve(pr["prompt"]) != pr["answer"] or not reserved(pr["prompt"]):
                print("%s:%d: %r" % (path, n, pr), file=sys.stderr)
                bad += 1
    return bad


def main(argv):
    if len(argv) == 3 and argv[1] == "tokenizer":
        write_tokenizer(argv[2])
    elif len(argv) == 5 and argv[1] == "heldout":
        with open(argv[4], "w") as f:
            for pr in heldout(int(argv[2]), int(argv[3])):
                f.write(json.dumps(pr) + "\n")
    elif len(argv) == 3 and argv[1] == "check":
        return 1 if check(argv[2]) else 0
    else:
        print(__doc__.split("usage:")[1], file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
