#!/usr/bin/env python3
"""bpe.py: a byte-level BPE tokenizer for pipedream's token shards, in plain Python 3 (standard
library only).

  bpe.py train TEXT --vocab N --out TOKENIZER.json     learn N - 256 merges from a UTF-8 text
  bpe.py encode TEXT --tokenizer T.json --out DIR [--name NAME] [--val-fraction F]
                                                       write DIR/NAME_train.bin, DIR/NAME_val.bin
                                                       (the last F of the text, default 0.05) and
                                                       DIR/tokenizer.json
  bpe.py decode SHARD --tokenizer T.json               print a shard's text (to check a round trip)
  bpe.py model MODEL.json --tokenizer T.json --out M.json
                                                       a language model's copy with the tokenizer's
                                                       vocabulary (every embed layer's "vocab" and
                                                       the last layer's "out")

Tokens 0..255 are the bytes; token 256 + i is merge i, the concatenation of its two parts.
The text is first cut into pieces (a word with its leading space, a run of digits, of
punctuation, of spaces; merges never cross a piece), and training counts each distinct piece
once with its number of occurrences. Each merge takes the most frequent adjacent pair (ties:
the smaller pair of ids) and updates only the pieces that hold it: the pair counts change by
what those pieces lose and gain, and a heap with stale entries skipped finds the next most
frequent pair, so a merge costs what it touches rather than a recount of the text.

The tokenizer file (JSON): format "pipedream-bpe", version 1, vocab_size, merges ([a, b] per
merge, in order), token_bytes (each token's length in bytes: the C side turns a loss per token
into one per byte with it) and tokens (each token's bytes in hex).

Shards are llm.c's format: 256 little-endian int32 (20240520, 1, token count, then zeros),
then the tokens as little-endian uint16 (so at most 65536 tokens in the vocabulary).
"""
import argparse
import heapq
import json
import os
import re
import struct
import sys
from array import array
from collections import Counter

SHARD_MAGIC = 20240520
PIECE = re.compile(r"'(?:[sdmt]|ll|ve|re)| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")


def pieces(text):
    """The text's pieces as UTF-8 byte strings (a piece never spans a merge boundary)."""
    return [m.encode("utf-8") for m in PIECE.findall(text)]


def train(text, vocab):
    """The merges ((a, b) per new token, in order) that bring the vocabulary to `vocab`."""
    if vocab < 256 or vocab > 65536:
        raise SystemExit("bpe.py: --vocab %d: expected 256..65536" % vocab)
    counted = Counter(pieces(text))
    words = [list(w) for w in counted]          # each distinct piece as token ids
    freq = [counted[w] for w in counted]
    pairs = Counter()                          # pair -> occurrences over the text
    where = {}                                 # pair -> indices of the pieces holding it
    for i, w in enumerate(words):
        for p in zip(w, w[1:]):
            pairs[p] += freq[i]
            where.setdefault(p, set()).add(i)
    heap = [(-c, p) for p, c in pairs.items()]
    heapq.heapify(heap)
    merges = []
    while len(merges) < vocab - 256 and heap:
        c, p = heapq.heappop(heap)
        if pairs.get(p, 0) != -c or c == 0:
            continue                           # a stale entry: the count changed since
        new = 256 + len(merges)
        merges.append(p)
        a, b = p
        touched = Counter()
        for i in where.pop(p, ()):
            w, f = words[i], freq[i]
            for q in zip(w, w[1:]):            # the piece's pairs leave ...
                touched[q] -= f
            out, k = [], 0
            while k < len(w):
                if k + 1 < len(w) and w[k] == a and w[k + 1] == b:
                    out.append(new)
                    k += 2
                else:
                    out.append(w[k])
                    k += 1
            words[i] = out
            for q in zip(out, out[1:]):        # ... and the merged piece's come back
                touched[q] += f
                where.setdefault(q, set()).add(i)
        for q, d in touched.items():
            if d == 0:
                continue
            n = pairs.get(q, 0) + d
            if n > 0:
                pairs[q] = n
                heapq.heappush(heap, (-n, q))
            else:
                pairs.pop(q, None)
                where.pop(q, None)
        pairs.pop(p, None)
    return merges


def token_bytes(merges):
    """Each token's bytes."""
    t = [bytes([i]) for i in range(256)]
    for a, b in merges:
        t.append(t[a] + t[b])
    return t


class Encoder:
    def __init__(self, merges):
        self.rank = {tuple(p): 256 + i for i, p in enumerate(merges)}
        self.cache = {}

    def piece(self, w):
        """One piece's tokens: repeatedly the earliest-learned merge present in it."""
        got = self.cache.get(w)
        if got is not None:
            return got
        t = list(w)
        while len(t) > 1:
            best = None
            for q in zip(t, t[1:]):
                r = self.rank.get(q)
                if r is not None and (best is None or r < best):
                    best = r
            if best is None:
                break
            out, k = [], 0
            while k < len(t):
                if k + 1 < len(t) and self.rank.get((t[k], t[k + 1])) == best:
                    out.append(best)
                    k += 2
                else:
                    out.append(t[k])
                    k += 1
            t = out
        self.cache[w] = t
        return t

    def encode(self, text):
        out = array("H")
        for w in pieces(text):
            out.extend(self.piece(w))
        return out


def load(path):
    with open(path) as f:
        tok = json.load(f)
    if tok.get("format") != "pipedream-bpe" or tok.get("version") != 1:
        raise SystemExit("bpe.py: %s: not a pipedream-bpe tokenizer (version 1)" % path)
    return [tuple(m) for m in tok["merges"]]


def save(path, merges):
    tb = token_bytes(merges)
    doc = {"format": "pipedream-bpe", "version": 1, "vocab_size": 256 + len(merges),
           "merges": [list(m) for m in merges], "token_bytes": [len(t) for t in tb],
           "tokens": [t.hex() for t in tb]}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    os.replace(tmp, path)


def write_shard(path, tokens):
    header = array("i", [0] * 256)
    header[0], header[1], header[2] = SHARD_MAGIC, 1, len(tokens)
    body = array("H", tokens)
    if sys.byteorder != "little":
        header.byteswap()
        body.byteswap()
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(body.tobytes())
    os.replace(tmp, path)


def read_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, n = struct.unpack("<3i", data[:12])
    if magic != SHARD_MAGIC or version != 1 or len(data) != 1024 + 2 * n:
        raise SystemExit("bpe.py: %s: not a token shard (magic %d, version %d, %d tokens, %d bytes)"
                         % (path, magic, version, n, len(data)))
    body = array("H")
    body.frombytes(data[1024:])
    if sys.byteorder != "little":
        body.byteswap()
    return body


def read_text(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def main():
    ap = argparse.ArgumentParser(description="byte-level BPE: train merges, encode text to token shards, decode")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="learn merges from a UTF-8 text")
    t.add_argument("text")
    t.add_argument("--vocab", type=int, required=True, help="vocabulary size (256 bytes + merges)")
    t.add_argument("--out", required=True, help="tokenizer JSON to write")
    e = sub.add_parser("encode", help="encode a text into a training and a validation shard")
    e.add_argument("text")
    e.add_argument("--tokenizer", required=True)
    e.add_argument("--out", required=True, help="shard directory (created)")
    e.add_argument("--name", default="data", help="shard name prefix (default data)")
    e.add_argument("--val-fraction", type=float, default=0.05, help="the text's last part held out (default 0.05)")
    d = sub.add_parser("decode", help="print a shard's text")
    d.add_argument("shard")
    d.add_argument("--tokenizer", required=True)
    m = sub.add_parser("model", help="a model JSON's copy with the tokenizer's vocabulary")
    m.add_argument("model")
    m.add_argument("--tokenizer", required=True)
    m.add_argument("--out", required=True)
    a = ap.parse_args()

    if a.cmd == "model":
        vocab = 256 + len(load(a.tokenizer))
        with open(a.model) as f:
            doc = json.load(f)
        layers = doc["layers"]
        embeds = [l for l in layers if l.get("type") == "embed"]
        if not embeds or "out" not in layers[-1]:
            raise SystemExit("bpe.py: %s: expected an embed layer and a last layer with \"out\" (a language model)"
                             % a.model)
        for l in embeds:
            l["vocab"] = vocab
        layers[-1]["out"] = vocab
        doc["name"] = "%s-%d" % (doc["name"], vocab)
        doc.pop("comment", None)
        doc["comment"] = "%s with a vocabulary of %d (bpe.py model, %s)" % (a.model, vocab, os.path.basename(a.tokenizer))
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        return

    if a.cmd == "train":
        merges = train(read_text(a.text), a.vocab)
        save(a.out, merges)
        print("bpe.py: %s: %d tokens (%d merges)" % (a.out, 256 + len(merges), len(merges)), file=sys.stderr)
    elif a.cmd == "encode":
        if not 0 < a.val_fraction < 1:
            raise SystemExit("bpe.py: --val-fraction %g: expected in (0, 1)" % a.val_fraction)
        merges = load(a.tokenizer)
        text = read_text(a.text)
        cut = int(len(text) * (1 - a.val_fraction))
        while 0 < cut < len(text) and not text[cut].isspace():   # the split at a piece boundary
            cut += 1
        enc = Encoder(merges)
        os.makedirs(a.out, exist_ok=True)
        for split, part in (("train", text[:cut]), ("val", text[cut:])):
            toks = enc.encode(part)
            write_shard(os.path.join(a.out, "%s_%s.bin" % (a.name, split)), toks)
            nbytes = len(part.encode("utf-8"))
            print("bpe.py: %s %s: %d tokens, %d bytes (%.3f bytes per token)"
                  % (a.out, split, len(toks), nbytes, nbytes / max(1, len(toks))), file=sys.stderr)
        save(os.path.join(a.out, "tokenizer.json"), merges)
    else:
        tb = token_bytes(load(a.tokenizer))
        toks = read_shard(a.shard)
        if any(x >= len(tb) for x in toks):
            raise SystemExit("bpe.py: %s: a token beyond the tokenizer's %d" % (a.shard, len(tb)))
        sys.stdout.buffer.write(b"".join(tb[x] for x in toks))


if __name__ == "__main__":
    main()
