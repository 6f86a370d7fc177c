#!/usr/bin/env python
"""Raw parallel text, any language pair -> cleaned, joint-subword text (subword-nmt or
sentencepiece), optionally binarized for fairseq, with pip-installable tools
(sacremoses, subword-nmt, sentencepiece) instead of a Moses checkout.

For your own corpus (docs/data.md, "Bring your own data"):

    python scripts/prepare/prepare_translation.py OUT --src fr --tgt en --train corpus/train \\
        --valid corpus/dev --test corpus/test --bpe sentencepiece --vocab-size 8000 \\
        --binarize --joined-dictionary

reads ``corpus/train.fr`` / ``corpus/train.en`` and so on (a file name with ``{l}`` is
a template for the language instead, e.g. ``--train 'orig/train.tags.de-en.{l}'``).
It also reproduces fairseq's ``examples/translation/prepare-iwslt14.sh``
(``examples/mgs/iwslt14_de_en.sh``) and ``prepare-wmt14en2de.sh`` (``examples/mh_sampler/wmt.sh``) step
by step, and prepares Multi30k (``scripts/prepare/prepare_multi30k.sh``):

1. training files: ``--iwslt-tags`` drops the ``<url>``, ``<talkid>`` and
   ``<keywords>`` lines and the ``<title>``/``<description>`` tags; ``--normalize``
   normalizes punctuation and removes non-printing characters (Moses);
   ``--tokenize moses`` (the default with subword-nmt) Moses-tokenizes, ``-a``
   aggressive dash splits with ``--aggressive``; ``--tokenize none`` (the default
   with sentencepiece, which needs no pre-tokenization) keeps the text;
2. clean-corpus-n (unless ``--no-clean``): whitespace squeezed, pairs with a side
   outside [``--min-len``, ``--max-len``] tokens or a length ratio above ``--ratio``
   dropped; a line says how many pairs each rule dropped (also in ``stats.json``);
3. ``--lowercase``;
4. valid = ``--valid`` files, or every ``--valid-every``-th training pair (train =
   the rest);
5. test (optional) and ``--valid`` from ``.xml`` / ``.sgm`` files (the ``<seg id``
   lines) or plain text, tokenized (and lowercased) the same way, each concatenated
   in the order given;
6. joint subwords learned on train (both sides), applied to every split:
   ``--bpe subword_nmt`` (``learn_bpe`` with ``--vocab-size`` merges) or ``--bpe
   sentencepiece`` (a BPE model of ``--vocab-size`` pieces);
7. ``--binarize``: ``fairseq-preprocess`` into ``OUT/bin`` (``--joined-dictionary``
   for one dictionary of both sides, needed by ``--share-all-embeddings``).

Output: ``OUT/tok/{train,valid,test}.{src,tgt}`` (the text of steps 1-5),
``OUT/code`` (subword-nmt) or ``OUT/spm.model`` / ``.vocab`` (sentencepiece),
``OUT/{train,valid,test}.{src,tgt}`` (subwords), ``OUT/stats.json`` (pairs per
split; ``train_dropped``: training pairs each cleaning rule dropped), with ``--binarize`` ``OUT/bin`` and ``OUT/preprocess.log``. A missing input
file, a bad option value or a failed step stops it with one line naming it.
"""
import argparse
import json
import os
import re
import subprocess
import sys
from multiprocessing import Pool
from typing import Dict, Iterable, List, Sequence, Tuple

IWSLT_DROP = ("<url>", "<talkid>", "<keywords>")
IWSLT_STRIP = re.compile(r"</?(title|description)>")
SEG = re.compile(r'^\s*<seg id="?[^>]*>\s*(.*?)\s*</seg>\s*$')
# Romanian as in Sennrich's WMT16 scripts (normalise-romanian.py, remove-diacritics.py)
RO_MAP = str.maketrans({"\u015e": "S", "\u015f": "s", "\u0218": "S", "\u0219": "s", "\u0162": "T", "\u0163": "t",
                        "\u021a": "T", "\u021b": "t", "\u0102": "A", "\u0103": "a", "\u00c2": "A", "\u00e2": "a",
                        "\u00ce": "I", "\u00ee": "i"})

_WORKER = {}


def _init_worker(lang: str, moses: bool, aggressive: bool, normalize: bool, lowercase: bool,
                 romanian: bool) -> None:
    if moses or normalize:
        from sacremoses import MosesPunctNormalizer, MosesTokenizer
    _WORKER.update(tok=MosesTokenizer(lang=lang) if moses else None,
                   norm=MosesPunctNormalizer(lang=lang) if normalize else None,
                   aggressive=aggressive, lowercase=lowercase, romanian=romanian)


def _tokenize(line: str) -> str:
    w = _WORKER
    if w["norm"] is not None:
        line = w["norm"].normalize(line)
        line = "".join(c for c in line if c.isprintable() or c == " ")  # remove-non-printing-char.perl
    if w["romanian"]:
        line = line.translate(RO_MAP)
    if w["tok"] is not None:
        line = w["tok"].tokenize(line, aggressive_dash_splits=w["aggressive"], return_str=True, escape=True)
    return line.lower() if w["lowercase"] else line


def tokenize(lines: Sequence[str], lang: str, a: argparse.Namespace, lowercase: bool) -> List[str]:
    romanian = a.romanian and lang == "ro"
    if a.tokenize == "none" and not (a.normalize or romanian or lowercase):
        return list(lines)
    init = (lang, a.tokenize == "moses", a.aggressive, a.normalize, lowercase, romanian)
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


DROP_RULES = ("empty", "min_len", "max_len", "ratio")  # clean-corpus-n's rules, in the order they are tried


def clean(pairs: Iterable[Tuple[str, str]], lo: int, hi: int, ratio: float
          ) -> Tuple[List[Tuple[str, str]], Dict[str, int]]:
    """clean-corpus-n.perl: squeeze whitespace, drop empty, too short / long or unbalanced pairs.
    Returns the kept pairs and how many each rule dropped (a pair counts under the first rule
    it breaks)."""
    out, dropped = [], dict.fromkeys(DROP_RULES, 0)
    for s, t in pairs:
        s, t = " ".join(s.replace("|", "").split()), " ".join(t.replace("|", "").split())
        ns, nt = len(s.split()), len(t.split())
        rule = ("empty" if ns == 0 or nt == 0 else "min_len" if min(ns, nt) < lo else "max_len" if max(ns, nt) > hi
                else "ratio" if ns / nt > ratio or nt / ns > ratio else None)
        if rule:
            dropped[rule] += 1
        else:
            out.append((s, t))
    return out, dropped


def cleaning_report(kept: int, dropped: Dict[str, int], a: argparse.Namespace) -> str:
    """One line: how many training pairs the cleaning kept, and what each rule dropped."""
    total = kept + sum(dropped.values())
    why = {"empty": "an empty side", "min_len": f"a side shorter than --min-len {a.min_len}",
           "max_len": f"a side longer than --max-len {a.max_len} tokens",
           "ratio": f"a length ratio above --ratio {a.ratio:g}"}
    parts = ", ".join(f"{dropped[r]} for {why[r]}" for r in DROP_RULES)
    share = 100.0 * (total - kept) / max(total, 1)
    return (f"cleaning: kept {kept} of {total} training pairs, dropped {total - kept} ({share:.1f}%): {parts} "
            f"(--no-clean keeps them all)")


def input_file(name: str, lang: str) -> str:
    """``name`` with ``{l}`` replaced by the language, or else ``name.lang`` (a prefix)."""
    return name.replace("{l}", lang) if "{l}" in name else f"{name}.{lang}"


def read_split(names: Sequence[str], src: str, tgt: str, iwslt_train: bool) -> Tuple[List[str], List[str]]:
    xs, ys = [], []
    for name in names:
        x, y = read_raw(input_file(name, src), iwslt_train), read_raw(input_file(name, tgt), iwslt_train)
        if len(x) != len(y):
            sys.exit(f"prepare_translation: {input_file(name, src)} has {len(x)} lines, "
                     f"{input_file(name, tgt)} {len(y)}")
        xs += x
        ys += y
    return xs, ys


def write(path: str, lines: Iterable[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


def read(path: str) -> List[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


_BPE = {}


def _init_bpe(code: str) -> None:
    from subword_nmt.apply_bpe import BPE

    with open(code, encoding="utf-8") as f:
        _BPE["bpe"] = BPE(f)


def _apply_bpe(line: str) -> str:
    return _BPE["bpe"].process_line(line)


def subword_nmt(a: argparse.Namespace, tok_dir: str, splits: Sequence[str]) -> None:
    """Joint subword-nmt BPE (``--vocab-size`` merges) learned on the training text of both
    sides, applied to every split (``tok/SPLIT.LANG`` -> ``SPLIT.LANG``)."""
    from subword_nmt.learn_bpe import learn_bpe

    code = os.path.join(a.out_dir, "code")
    joint = os.path.join(tok_dir, f"train.{a.src}-{a.tgt}")
    with open(joint, "w", encoding="utf-8") as f:
        for lang in (a.src, a.tgt):
            with open(os.path.join(tok_dir, f"train.{lang}"), encoding="utf-8") as g:
                f.writelines(g)
    with open(joint, encoding="utf-8") as f, open(code, "w", encoding="utf-8") as g:
        learn_bpe(f, g, a.vocab_size, num_workers=max(1, a.workers))
    with Pool(max(1, a.workers), initializer=_init_bpe, initargs=(code,)) as pool:
        for split in splits:
            for lang in (a.src, a.tgt):
                lines = read(os.path.join(tok_dir, f"{split}.{lang}"))
                write(os.path.join(a.out_dir, f"{split}.{lang}"), pool.map(_apply_bpe, lines, chunksize=1000))


def sentencepiece(a: argparse.Namespace, tok_dir: str, splits: Sequence[str]) -> None:
    """A joint sentencepiece BPE model of ``--vocab-size`` pieces trained on every training
    sentence of both sides (no sampling: deterministic), applied to every split."""
    import sentencepiece as spm

    try:
        spm.SentencePieceTrainer.train(
            input=[os.path.join(tok_dir, f"train.{lang}") for lang in (a.src, a.tgt)],
            model_prefix=os.path.join(a.out_dir, "spm"), vocab_size=a.vocab_size, model_type="bpe",
            character_coverage=1.0, bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0, minloglevel=2, num_threads=2,
        )
    except RuntimeError as err:
        sys.exit(f"prepare_translation: --vocab-size {a.vocab_size}: sentencepiece: {str(err).strip()}")
    sp = spm.SentencePieceProcessor(model_file=os.path.join(a.out_dir, "spm.model"))
    for split in splits:
        for lang in (a.src, a.tgt):
            lines = read(os.path.join(tok_dir, f"{split}.{lang}"))
            write(os.path.join(a.out_dir, f"{split}.{lang}"),
                  (" ".join(sp.encode(line.strip(), out_type=str)) for line in lines))


def binarize(a: argparse.Namespace, splits: Sequence[str]) -> None:
    """``fairseq-preprocess`` of ``OUT/{split}.{src,tgt}`` into ``OUT/bin``."""
    dest, log = os.path.join(a.out_dir, "bin"), os.path.join(a.out_dir, "preprocess.log")
    if os.path.isdir(dest):
        import shutil

        shutil.rmtree(dest)
    cmd = [sys.executable, "-m", "fairseq_cli.preprocess", "--source-lang", a.src, "--target-lang", a.tgt,
           "--destdir", dest, "--workers", str(max(1, a.workers))]
    cmd += [arg for split in splits for arg in (f"--{split}pref", os.path.join(a.out_dir, split))]
    cmd += ["--joined-dictionary"] if a.joined_dictionary else []
    with open(log, "w") as f:
        if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode != 0:
            sys.exit(f"prepare_translation: fairseq-preprocess failed, see {log}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir")
    p.add_argument("--src", required=True, help="source language code (file suffix), e.g. fr")
    p.add_argument("--tgt", required=True, help="target language code (file suffix), e.g. en")
    p.add_argument("--train", nargs="+", required=True,
                   help="training files: PREFIX (PREFIX.SRC and PREFIX.TGT) or a template with {l}; several "
                        "are concatenated")
    p.add_argument("--test", nargs="*", default=[], help="test files, as --train (.xml/.sgm or plain); default: none")
    p.add_argument("--valid", nargs="*", default=[],
                   help="validation files, as --train (default: every --valid-every-th training pair)")
    p.add_argument("--valid-every", type=int, default=23,
                   help="with no --valid: pair n is valid when n %% N == 0 (fairseq's IWSLT'14 recipe: 23)")
    p.add_argument("--bpe", choices=["subword_nmt", "sentencepiece"], default="subword_nmt",
                   help="joint subword model (default: subword_nmt)")
    p.add_argument("--vocab-size", "--bpe-tokens", dest="vocab_size", type=int, default=10000,
                   help="subword-nmt merges, or sentencepiece pieces (default: 10000)")
    p.add_argument("--tokenize", choices=["moses", "none"], default=None,
                   help="pre-tokenization (default: moses with subword_nmt, none with sentencepiece)")
    p.add_argument("--no-clean", action="store_true", help="keep every training pair (no clean-corpus-n)")
    p.add_argument("--iwslt-tags", action="store_true", help="drop/strip the IWSLT metadata lines of training files")
    p.add_argument("--normalize", action="store_true", help="Moses punctuation normalization + non-printing removal")
    p.add_argument("--aggressive", action="store_true", help="Moses -a (aggressive hyphen splitting)")
    p.add_argument("--romanian", action="store_true", help="normalize Romanian and remove its diacritics (WMT16 Ro-En)")
    p.add_argument("--lowercase", action="store_true")
    p.add_argument("--min-len", type=int, default=1)
    p.add_argument("--max-len", type=int, default=175)
    p.add_argument("--ratio", type=float, default=1.5)
    p.add_argument("--binarize", action="store_true", help="fairseq-preprocess the result into OUT/bin")
    p.add_argument("--joined-dictionary", action="store_true", help="with --binarize: one dictionary for both sides")
    p.add_argument("--workers", type=int, default=1)
    a = p.parse_args(argv)
    a.tokenize = a.tokenize or ("moses" if a.bpe == "subword_nmt" else "none")
    for bad, message in ((a.vocab_size < 1, f"--vocab-size must be >= 1, got {a.vocab_size}"),
                         (a.valid_every < 2, f"--valid-every must be >= 2, got {a.valid_every}"),
                         (a.src == a.tgt, f"--src and --tgt must differ, got {a.src} twice"),
                         (a.joined_dictionary and not a.binarize, "--joined-dictionary goes with --binarize")):
        if bad:
            sys.exit(f"prepare_translation: {message}")
    for option, names in (("--train", a.train), ("--valid", a.valid), ("--test", a.test)):
        for name in names:
            for lang in (a.src, a.tgt):
                if not os.path.isfile(input_file(name, lang)):
                    sys.exit(f"prepare_translation: {option}: missing input file {input_file(name, lang)}")
    tok_dir = os.path.join(a.out_dir, "tok")
    os.makedirs(tok_dir, exist_ok=True)

    # train: tokenize, clean, lowercase (clean-corpus-n runs before lowercase.perl, as in fairseq)
    xs, ys = read_split(a.train, a.src, a.tgt, a.iwslt_tags)
    pairs = list(zip(tokenize(xs, a.src, a, False), tokenize(ys, a.tgt, a, False)))
    dropped = None
    if not a.no_clean:
        pairs, dropped = clean(pairs, a.min_len, a.max_len, a.ratio)
        print(cleaning_report(len(pairs), dropped, a))
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
    if a.test:
        tx, ty = read_split(a.test, a.src, a.tgt, False)
        splits["test"] = list(zip(tokenize(tx, a.src, a, a.lowercase), tokenize(ty, a.tgt, a, a.lowercase)))
    names = [split for split in ("train", "valid", "test") if split in splits]
    for split in names:
        for i, lang in enumerate((a.src, a.tgt)):
            write(os.path.join(tok_dir, f"{split}.{lang}"), (pr[i] for pr in splits[split]))

    (subword_nmt if a.bpe == "subword_nmt" else sentencepiece)(a, tok_dir, names)
    stats = {split: len(splits[split]) for split in names}
    for split in names:
        print(f"{split}: {stats[split]} pairs")
    with open(os.path.join(a.out_dir, "stats.json"), "w") as f:
        json.dump(dict(stats, **({"train_dropped": dropped} if dropped is not None else {})), f, indent=1)
    if a.binarize:
        binarize(a, names)
        print(f"done: {os.path.join(a.out_dir, 'bin')} ({a.bpe} subwords: the criteria's --*-post-process auto "
              f"finds them; fairseq-generate needs --post-process {a.bpe})")


if __name__ == "__main__":
    main()
