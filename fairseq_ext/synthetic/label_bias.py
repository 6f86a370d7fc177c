"""A synthetic tagging task with label bias (Lafferty et al. 2001; Andor et al.
2016; Goyal thesis section 5.4.2): some labels depend on the *next* word, so a
tagger that reads left to right must defer their decision.

Words are ``F0 .. F{m-1}`` ("future" words) and ``P0 .. P{m-1}`` ("past" words);
word ``X{j}`` has colour ``j % 2``. The label of word i (1-based, n words) is

    x_i = F*:  A if colour(x_{i+1}) = 0 else B      (future-dependent, d = 1)
    x_i = P*:  C if colour(x_i)     = 0 else D      (depends on the word itself)

The last word is always a P word, so every F word has a successor; the other
words are uniform over all 2m words, and n is uniform in [min_len, max_len].
The future-dependent positions are exactly those whose gold label is A or B.

Why this task separates local from global normalisation. A tagger that reads
x_1..x_i before it scores y_i (``tagging_lstm --encoder-unidirectional``) cannot know
y_i at an F position: the next word's colour is a fair coin, so greedy decoding
is at chance (50%) there, under any training. A beam can defer the decision: at
step i it keeps both y_i = A and y_i = B; at step i+1 the decoder sees x_{i+1}
(its encoder state) and y_i (its previous-label input), so the score of step i+1
can rule the inconsistent hypothesis out. (If x_{i+1} is a P word the check is a
label transition, A -> C, B -> D; if it is an F word it is between y_i and the
word's colour.) Only one decision is ever pending (d = 1), so a beam of 2
suffices; the thesis trains with 3.

- Globally normalised scores (raw logits) can give the inconsistent hypothesis an
  arbitrarily low score at step i+1: beam search then recovers every F label.
- Locally normalised scores cannot change the *prefix* probability
  p(y_1..y_i | x) = p(y_1..y_i | x_1..x_i) (Andor et al.'s argument): all a local
  model can do is make the best continuation of an inconsistent prefix less
  likely than that of a consistent one, by at most log(#labels) = log 4 per step
  (a uniform next-label distribution). Cross-entropy trains on gold prefixes
  only, which are always consistent, so nothing teaches it to do that: CE + beam
  stays at chance. A locally normalised model trained *through* the beam could in
  principle learn it; the experiment measures whether it does.
- A bidirectional encoder sees x_{i+1} at step i: no deferral needed.

CLI: ``python -m fairseq_ext.synthetic.label_bias OUT_DIR [--train N --valid N --test N
--seed S --words M --min-len L --max-len L]`` writes ``OUT_DIR/{train,dev,test}.txt``
in the two-column CoNLL format of ``--task sequence_tagging`` (``word label`` per
line, a blank line between sentences; read it with the default ``--tagging-column ner``,
the last column); ``python -m fairseq_ext.synthetic.label_bias --score GEN_OUT`` prints the
accuracy of fairseq-generate output on the future-dependent positions and
overall (JSON).
"""
import argparse
import json
import os
import random
from typing import Dict, List, Sequence, Tuple

FUTURE_LABELS = ("A", "B")  # gold labels of the future-dependent positions
PAST_LABELS = ("C", "D")


def label_bias_sentence(rng: random.Random, words: int = 6, min_len: int = 3,
                        max_len: int = 8) -> List[Tuple[str, str]]:
    """One sentence: a list of (word, label) pairs (see the module docstring)."""
    n = rng.randint(min_len, max_len)
    future = [f"F{j}" for j in range(words)]
    past = [f"P{j}" for j in range(words)]
    xs = [rng.choice(future + past) for _ in range(n - 1)] + [rng.choice(past)]
    colour = [int(w[1:]) % 2 for w in xs]
    labels = [FUTURE_LABELS[colour[i + 1]] if w[0] == "F" else PAST_LABELS[colour[i]] for i, w in enumerate(xs)]
    return list(zip(xs, labels))


def write_label_bias_data(out_dir: str, sizes: Sequence[int] = (2000, 200, 500), seed: int = 1, words: int = 6,
                          min_len: int = 3, max_len: int = 8) -> str:
    """Write ``out_dir/{train,dev,test}.txt`` (sizes in sentences); returns ``out_dir``.
    Deterministic in its arguments; each split has its own random stream."""
    if words < 2 or not 2 <= min_len <= max_len:
        raise ValueError(f"need words >= 2 and 2 <= min_len <= max_len, got {words}, {min_len}, {max_len}")
    os.makedirs(out_dir, exist_ok=True)
    for i, (name, n) in enumerate(zip(("train.txt", "dev.txt", "test.txt"), sizes)):
        rng = random.Random(seed * 1000 + i)
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            for _ in range(n):
                f.writelines(f"{w} {t}\n" for w, t in label_bias_sentence(rng, words, min_len, max_len))
                f.write("\n")
    return out_dir


def accuracies(hyps: List[List[str]], refs: List[List[str]]) -> Dict[str, float]:
    """Accuracy (percent) on the future-dependent positions (gold A or B), on the
    others, and overall; with the position counts."""
    n = {"future": 0, "past": 0}
    right = {"future": 0, "past": 0}
    for h, r in zip(hyps, refs):
        if len(h) != len(r):
            raise ValueError(f"{len(h)} predicted labels for {len(r)} reference labels")
        for p, g in zip(h, r):
            kind = "future" if g in FUTURE_LABELS else "past"
            n[kind] += 1
            right[kind] += p == g
    total = n["future"] + n["past"]
    return {
        "future_acc": 100.0 * right["future"] / max(n["future"], 1),
        "past_acc": 100.0 * right["past"] / max(n["past"], 1),
        "accuracy": 100.0 * (right["future"] + right["past"]) / max(total, 1),
        "future_positions": n["future"],
        "positions": total,
    }


def score_generate_output(path: str) -> Dict[str, float]:
    """``accuracies`` of a fairseq-generate output file (its H- and T- lines)."""
    from fairseq_ext.evaluation.generate_output import read_generate_file

    g = read_generate_file(path)
    return accuracies([h.split() for h in g.raw], [r.split() for r in g.references])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir", nargs="?")
    p.add_argument("--train", type=int, default=2000)
    p.add_argument("--valid", type=int, default=200)
    p.add_argument("--test", type=int, default=500)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--words", type=int, default=6, help="F and P words each (colour = index %% 2)")
    p.add_argument("--min-len", type=int, default=3)
    p.add_argument("--max-len", type=int, default=8)
    p.add_argument("--score", metavar="GEN_OUT", help="score fairseq-generate output instead (prints JSON)")
    a = p.parse_args(argv)
    if a.score:
        print(json.dumps(score_generate_output(a.score)))
        return
    if not a.out_dir:
        p.error("OUT_DIR is required (or --score GEN_OUT)")
    write_label_bias_data(a.out_dir, (a.train, a.valid, a.test), a.seed, a.words, a.min_len, a.max_len)
    print(f"wrote label-bias data ({a.train}/{a.valid}/{a.test} sentences) to {a.out_dir}")


if __name__ == "__main__":
    main()
