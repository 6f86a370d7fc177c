#!/usr/bin/env python
"""Raw parallel text -> Moses-tokenized, cleaned, (lowercased), joint-BPE text, with
pip-installable tools (sacremoses, subword-nmt) instead of a Moses checkout.

Reproduces fairseq's ``examples/translation/prepare-iwslt14.sh`` (``--preset
iwslt14``) and ``prepare-wmt14en2de.sh`` (``--preset wmt``) step by step:

1. training files: IWSLT drops the ``<url>``, ``<talkid>`` and ``<keywords>`` lines
   and the ``<title>``/``<description>`` tags; WMT normalizes punctuation and
   removes non-printing characters (``--normalize``); Moses tokenization
   (``-a`` aggressive dash splits with ``--aggressive``);
2. clean-corpus-n: whitespace squeezed, pairs with a side outside
   [``--min-len``, ``--max-len``] tokens or a length ratio above ``--ratio`` dropped;
3. ``--lowercase``;
4. valid = every ``--valid-every``-th training pair, train = the rest;
5. test (and ``--valid`` if given) from ``.xml`` / ``.sgm`` files (the ``<seg id``
   lines) or plain text, tokenized (and lowercased) the same way, concatenated in
   the order given;
6. joint BPE: subword-nmt ``learn_bpe`` with ``--bpe-tokens`` merges on train
   (both sides), applied to every split.

Files are named with ``{l}`` for the language, e.g.
``--train 'orig/de-en/train.tags.de-en.{l}'``.

Output: ``OUT/tok/{train,valid,test}.{src,tgt}``, ``OUT/code``,
``OUT/{train,valid,test}.{src,tgt}`` (BPE), ``OUT/stats.json`` (pairs per split).
"""
import argparse
import json
import os
import re
import sys
from multiprocessing import Pool
from typing import Iterable, List, Sequence, Tuple

IWSLT_DROP = ("<url>", "<talkid>", "<keywords>")
IWSLT_STRIP = re.compile(r"</?(title|description)>")
SEG = re.compile(r'^\s*<seg id="?[^>]*>\s*(.*?)\s*</seg>\s*$')
# Romanian as in Sennrich's WMT16 scripts (normalise-romanian.py, remove-diacritics.py)
RO_MAP = str.maketrans({"\u015e": "S", "\u015f": "s", "\u0218": "S", "\u0219": "s", "\u0162": "T", "\u0163": "t",
                        "\u021a": "T", "\u021b": "t", "\u0102": "A", "\u0103": "a", "\u00c2": "A", "\u00e2": "a",
                        "\u00ce": "I", "\u00ee": "i"})

_WORKER = {}


def _init_worker(lang: str, aggressive: bool, normalize: bool, lowercase: bool, romanian: bool) -> None:
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    _WORKER.update(tok=MosesTokenizer(lang=lang), norm=MosesPunctNormalizer(lang=lang) if normalize else None,
                   aggressive=aggressive, lowercase=lowercase, romanian=romanian)


def _tokenize(line: str) -> str:
    w = _WORKER
    if w["norm"] is not None:
        line = w["norm"].normalize(line)
        line = "".join(c for c in line if c.isprintable() or c == " ")  # remove-non-printing-char.perl
    if w["romanian"]:
        line = line.translate(RO_MAP)
    line = w["tok"].tokenize(line, aggressive_dash_splits=w["aggressive"], return_str=True, escape=True)
    return line.lower() if w["lowercase"] else line


def tokenize(lines: Sequence[str], lang: str, a: argparse.Namespace, lowercase: bool) -> List[str]:
    romanian = a.romanian and lang == "ro"
    init = (lang, a.aggressive, a.normalize, lowercase, romanian)
    if a.workers <= 1 or len(lines) < 2000:
        _init_worker(*init)
        return [_tokenize(x) for x in lines]
    with Pool(a.workers, initializer=_init_worker, initargs=init) as pool:
        return pool.map(_tokenize, lines, chunksize=1000)


def read_raw(path: str, iwslt_train: bool) -> List[str]:
    """Lines of a raw file: the <seg> contents of .xml/.sgm, else every line (IWSLT: tags dropped)."""
    with open(path, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    if path.endswith((".xml", ".sgm")):
        segs = [SEG.match(line) for line in lines if "<seg id" in line]
        return [m.group(1).replace("\u2019", "'") if m else "" for m in segs]
    if iwslt_train:
        return [IWSLT_STRIP.sub("", line) for line in lines if not any(t in line for t in IWSLT_DROP)]
    return lines


def clean(pairs: Iterable[Tuple[str, str]], lo: int, hi: int, ratio: float) -> List[Tuple[str, str]]:
    """clean-corpus-n.perl: squeeze whitespace, drop empty, too short / long or unbalanced pairs."""
    out = []
    for s, t in pairs:
        s, t = " ".join(s.replace("|", "").split()), " ".join(t.replace("|", "").split())
        ns, nt = len(s.split()), len(t.split())
        if ns == 0 or nt == 0 or not (lo <= ns <= hi and lo <= nt <= hi):
            continue
        if ns / nt > ratio or nt / ns > ratio:
            continue
        out.append((s, t))
    return out


def read_split(templates: Sequence[str], src: str, tgt: str, iwslt_train: bool) -> Tuple[List[str], List[str]]:
    xs, ys = [], []
    for tpl in templates:
        x, y = read_raw(tpl.format(l=src), iwslt_train), read_raw(tpl.format(l=tgt), iwslt_train)
        if len(x) != len(y):
            sys.exit(f"prepare_translation: {tpl.format(l=src)} has {len(x)} lines, {tpl.format(l=tgt)} {len(y)}")
        xs += x
        ys += y
    return xs, ys


def write(path: str, lines: Iterable[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


_BPE = {}


def _init_bpe(code: str) -> None:
    from subword_nmt.apply_bpe import BPE

    with open(code, encoding="utf-8") as f:
        _BPE["bpe"] = BPE(f)


def _apply_bpe(line: str) -> str:
    return _BPE["bpe"].process_line(line)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir")
    p.add_argument("--src", required=True)
    p.add_argument("--tgt", required=True)
    p.add_argument("--train", nargs="+", required=True, help="training file templates with {l}")
    p.add_argument("--test", nargs="+", required=True, help="test file templates with {l} (.xml/.sgm or plain)")
    p.add_argument("--valid", nargs="*", default=[],
                   help="valid file templates (default: every --valid-every-th training pair)")
    p.add_argument("--valid-every", type=int, default=23,
                   help="with no --valid: pair n is valid when n %% N == 0 (fairseq's IWSLT'14 recipe: 23)")
    p.add_argument("--iwslt-tags", action="store_true", help="drop/strip the IWSLT metadata lines of training files")
    p.add_argument("--normalize", action="store_true", help="Moses punctuation normalization + non-printing removal")
    p.add_argument("--aggressive", action="store_true", help="Moses -a (aggressive hyphen splitting)")
    p.add_argument("--romanian", action="store_true", help="normalize Romanian and remove its diacritics (WMT16 Ro-En)")
    p.add_argument("--lowercase", action="store_true")
    p.add_argument("--min-len", type=int, default=1)
    p.add_argument("--max-len", type=int, default=175)
    p.add_argument("--ratio", type=float, default=1.5)
    p.add_argument("--bpe-tokens", type=int, default=10000, help="subword-nmt merges (joint)")
    p.add_argument("--workers", type=int, default=1)
    a = p.parse_args(argv)
    if a.bpe_tokens < 1 or a.valid_every < 2:
        p.error("--bpe-tokens must be >= 1 and --valid-every >= 2")
    for tpl in a.train + a.test + a.valid:
        for lang in (a.src, a.tgt):
            if not os.path.isfile(tpl.format(l=lang)):
                p.error(f"missing input file {tpl.format(l=lang)}")
    tok_dir = os.path.join(a.out_dir, "tok")
    os.makedirs(tok_dir, exist_ok=True)

    # train: tokenize, clean, lowercase (clean-corpus-n runs before lowercase.perl, as in fairseq)
    xs, ys = read_split(a.train, a.src, a.tgt, a.iwslt_tags)
    pairs = clean(zip(tokenize(xs, a.src, a, False), tokenize(ys, a.tgt, a, False)), a.min_len, a.max_len, a.ratio)
    if a.lowercase:
        pairs = [(s.lower(), t.lower()) for s, t in pairs]
    splits = {}
    if a.valid:
        splits["train"] = pairs
        vx, vy = read_split(a.valid, a.src, a.tgt, False)
        splits["valid"] = list(zip(tokenize(vx, a.src, a, a.lowercase), tokenize(vy, a.tgt, a, a.lowercase)))
    else:
        splits["valid"] = [pr for n, pr in enumerate(pairs, 1) if n % a.valid_every == 0]
        splits["train"] = [pr for n, pr in enumerate(pairs, 1) if n % a.valid_every != 0]
    tx, ty = read_split(a.test, a.src, a.tgt, False)
    splits["test"] = list(zip(tokenize(tx, a.src, a, a.lowercase), tokenize(ty, a.tgt, a, a.lowercase)))
    for split in ("train", "valid", "test"):
        for i, lang in enumerate((a.src, a.tgt)):
            write(os.path.join(tok_dir, f"{split}.{lang}"), (pr[i] for pr in splits[split]))

    # joint BPE on train (both sides), applied to every split
    from subword_nmt.learn_bpe import learn_bpe

    code = os.path.join(a.out_dir, "code")
    joint = os.path.join(tok_dir, f"train.{a.src}-{a.tgt}")
    with open(joint, "w", encoding="utf-8") as f:
        for lang in (a.src, a.tgt):
            with open(os.path.join(tok_dir, f"train.{lang}"), encoding="utf-8") as g:
                f.writelines(g)
    with open(joint, encoding="utf-8") as f, open(code, "w", encoding="utf-8") as g:
        learn_bpe(f, g, a.bpe_tokens, num_workers=max(1, a.workers))
    stats = {}
    with Pool(max(1, a.workers), initializer=_init_bpe, initargs=(code,)) as pool:
        for split in ("train", "valid", "test"):
            for lang in (a.src, a.tgt):
                with open(os.path.join(tok_dir, f"{split}.{lang}"), encoding="utf-8") as f:
                    lines = [line.rstrip("\n") for line in f]
                write(os.path.join(a.out_dir, f"{split}.{lang}"), pool.map(_apply_bpe, lines, chunksize=1000))
            stats[split] = len(lines)
            print(f"{split}: {len(lines)} pairs")
    with open(os.path.join(a.out_dir, "stats.json"), "w") as f:
        json.dump(stats, f, indent=1)


if __name__ == "__main__":
    main()
