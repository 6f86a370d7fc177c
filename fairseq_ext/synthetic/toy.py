"""The embedded default data set, shared by the demo, the tests
and the benchmarks (deterministic from a seed, no download).

The toy language pair is a small synthetic "translation" task with real
structure: source sentences come from a tiny grammar (determiner, optional
adjectives, noun, verb, optional object phrase, optional adverb); the target maps
every word through a fixed bilingual lexicon, puts adjectives after their noun,
and ends every sentence with a period, so a model must learn lexical choice, local
reordering and length. Some nouns have two translations, chosen at random (so
the task has an entropy floor and BLEU stays below 100, as with real data). Its
target side doubles as a language-modeling corpus for
the ``text_completion`` task.

CLI: ``python -m fairseq_ext.synthetic.toy OUT_DIR [--train N --valid N --test N --seed S]``
writes ``OUT_DIR/{train,valid,test}.{src,tgt}`` (one sentence a line) and
``OUT_DIR/{train,valid,test}.txt`` (the target side, for text completion).
"""
import argparse
import os
import random
from typing import List, Sequence, Tuple

_DETS = ["the", "a", "every", "some"]
_ADJS = ["red", "small", "old", "quiet", "happy", "green", "tall", "cold"]
_NOUNS = ["cat", "dog", "bird", "house", "river", "child", "tree", "car", "book", "song"]
_VERBS = ["sees", "likes", "finds", "carries", "follows", "hears", "builds", "sings"]
_ADVS = ["today", "again", "slowly", "often"]


def _lexicon() -> dict:
    src = _DETS + _ADJS + _NOUNS + _VERBS + _ADVS
    # target words: deterministic pseudo-words, one per source word
    syll = ["ka", "lo", "mi", "nu", "re", "sa", "ti", "vo", "ze", "pu", "gi", "ba"]
    rng = random.Random(1234)
    out, seen = {}, set()
    for w in src:
        while True:
            t = "".join(rng.choice(syll) for _ in range(rng.choice([1, 2, 2, 3])))
            if t not in seen:
                seen.add(t)
                out[w] = t
                break
    return out


LEXICON = _lexicon()
# second translations for some nouns, used with probability ALT_PROB
ALT_LEXICON = {n: LEXICON[n][::-1] + "n" for n in _NOUNS[::3]}
ALT_PROB = 0.3


def _noun(rng: random.Random, noun: str) -> str:
    if noun in ALT_LEXICON and rng.random() < ALT_PROB:
        return ALT_LEXICON[noun]
    return LEXICON[noun]


def _noun_phrase(rng: random.Random) -> Tuple[List[str], List[str]]:
    det = rng.choice(_DETS)
    adjs = [rng.choice(_ADJS) for _ in range(rng.choice([0, 0, 1, 1, 2]))]
    noun = rng.choice(_NOUNS)
    src = [det] + adjs + [noun]
    tgt = [LEXICON[det], _noun(rng, noun)] + [LEXICON[a] for a in adjs]  # adjectives follow the noun
    return src, tgt


def toy_pair(rng: random.Random) -> Tuple[str, str]:
    """One (source, target) sentence pair."""
    s_np, t_np = _noun_phrase(rng)
    verb = rng.choice(_VERBS)
    src, tgt = s_np + [verb], t_np + [LEXICON[verb]]
    if rng.random() < 0.7:
        o_src, o_tgt = _noun_phrase(rng)
        src, tgt = src + o_src, tgt + o_tgt
    if rng.random() < 0.4:
        adv = rng.choice(_ADVS)
        src, tgt = src + [adv], [LEXICON[adv]] + tgt  # adverbs move to the front
    return " ".join(src), " ".join(tgt + ["."])


def toy_corpus(n: int, seed: int) -> List[Tuple[str, str]]:
    rng = random.Random(seed)
    return [toy_pair(rng) for _ in range(n)]


def write_toy_data(out_dir: str, sizes: Sequence[int] = (2000, 200, 200), seed: int = 1) -> str:
    """Write the toy corpus (see the module docstring); returns ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    for i, (split, n) in enumerate(zip(("train", "valid", "test"), sizes)):
        pairs = toy_corpus(n, seed * 1000 + i)
        for ext, col in (("src", 0), ("tgt", 1)):
            with open(os.path.join(out_dir, f"{split}.{ext}"), "w") as f:
                f.writelines(p[col] + "\n" for p in pairs)
        with open(os.path.join(out_dir, f"{split}.txt"), "w") as f:
            f.writelines(p[1] + "\n" for p in pairs)
    return out_dir


def binarize_translation(raw_dir: str, dest_dir: str) -> str:
    """``fairseq-preprocess`` (in-process) of ``raw_dir/{split}.{src,tgt}`` with a
    joined dictionary; returns ``dest_dir``."""
    from fairseq import options
    from fairseq_cli import preprocess

    args = options.get_preprocessing_parser().parse_args(
        ["--source-lang", "src", "--target-lang", "tgt", "--joined-dictionary", "--workers", "1",
         "--trainpref", f"{raw_dir}/train", "--validpref", f"{raw_dir}/valid", "--testpref", f"{raw_dir}/test",
         "--destdir", dest_dir]
    )
    preprocess.main(args)
    return dest_dir


def binarize_lines(raw_dir: str, dest_dir: str) -> str:
    """``fairseq-preprocess --only-source`` of ``raw_dir/{split}.txt``; returns ``dest_dir``."""
    from fairseq import options
    from fairseq_cli import preprocess

    args = options.get_preprocessing_parser().parse_args(
        ["--only-source", "--workers", "1", "--trainpref", f"{raw_dir}/train.txt",
         "--validpref", f"{raw_dir}/valid.txt", "--testpref", f"{raw_dir}/test.txt", "--destdir", dest_dir]
    )
    preprocess.main(args)
    return dest_dir


# Toy CoNLL-2003 data (NER / POS columns) for the sequence_tagging tests

_PER_FIRST, _PER_LAST = ["John", "Mary", "Anna", "Peter"], ["Smith", "Brown", "Jones"]
_CITIES, _ORGS = ["Paris", "London", "Berlin", "Rome"], ["Acme", "Reuters", "Siemens"]
_FILL = [("the", "DT"), ("said", "VBD"), ("in", "IN"), ("visited", "VBD"), ("met", "VBD"), ("on", "IN"),
         ("Monday", "NNP"), ("1996", "CD"), ("and", "CC"), ("shares", "NNS")]


def _toy_entity(rng: random.Random) -> List[Tuple[str, str, str]]:
    kind = rng.choice(["PER", "LOC", "ORG"])
    if kind == "PER":
        words = [rng.choice(_PER_FIRST)] + ([rng.choice(_PER_LAST)] if rng.random() < 0.5 else [])
    elif kind == "LOC":
        words = [rng.choice(_CITIES)]
    else:
        words = [rng.choice(_ORGS)] + (["Corp"] if rng.random() < 0.5 else [])
    return [(w, "NNP", ("B-" if i == 0 else "I-") + kind) for i, w in enumerate(words)]


def _toy_tagged_sentence(rng: random.Random) -> List[Tuple[str, str, str]]:
    out = []
    for _ in range(rng.randint(1, 6)):
        if rng.random() < 0.35 and (not out or out[-1][2] == "O"):
            out += _toy_entity(rng)
        else:
            w, p = rng.choice(_FILL)
            out.append((w, p, "O"))
    return out


def write_toy_conll(root: str, sizes: Sequence[int] = (200, 30, 31), seed: int = 0) -> str:
    """train/dev/test.txt in CoNLL-2003 columns, with -DOCSTART- markers; entities
    are always followed or preceded by an O word, so the labels are learnable."""
    rng = random.Random(seed)
    os.makedirs(root, exist_ok=True)
    for name, n in zip(("train.txt", "dev.txt", "test.txt"), sizes):
        with open(os.path.join(root, name), "w", encoding="utf-8") as f:
            for i in range(n):
                if i % 50 == 0:
                    f.write("-DOCSTART- -X- -X- O\n\n")
                f.writelines(f"{w} {p} {t}\n" for w, p, t in _toy_tagged_sentence(rng))
                f.write("\n")
    return str(root)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--train", type=int, default=2000)
    p.add_argument("--valid", type=int, default=200)
    p.add_argument("--test", type=int, default=200)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    write_toy_data(a.out_dir, (a.train, a.valid, a.test), a.seed)
    print(f"wrote toy data ({a.train}/{a.valid}/{a.test} pairs) to {a.out_dir}")


if __name__ == "__main__":
    main()
