"""The embedded text-completion data set of ``make demo``: sequences that end, and
a greedy decoder that does not end them (deterministic from a seed, no download).

Every line is a walk w_1 .. w_n of a Markov chain over ``WORDS`` followed by ".".
From each word a the walk goes to its *dominant successor* s(a) with probability
``DOMINANT`` and to any other word uniformly otherwise; s is a permutation made
of cycles, so always taking the likeliest next word goes round a cycle forever.
After each word from position ``MIN_WORDS`` on, the walk stops with a
probability p(a) that depends on the word: ``STOP_HIGH`` for the words of the
first cycle, ``STOP_LOW`` for the rest. Every line ends (on average about
``MIN_WORDS + 2`` words), so the data has no loops at all.

Greedy decoding of the true distribution stops after word a only when
p(a) > (1 - p(a)) x DOMINANT, i.e. p(a) > 0.375 with the defaults: it ends
inside the first cycle (6 words, p = 0.5) and never in the others (3 words each,
p = 0.25), where it repeats the cycle to the length limit. A model that learns
the data well (MLE) inherits this: many of its greedy continuations of a 3-word
prefix (``--completion-context-size 3``) never terminate and are repetitive, and fitting the
data better does not change that. MGS (``--criterion mgs --mgs-task-loss lm``:
the continuation's negative log-probability under the frozen MLE model) rewards
decoded continuations that end (docs/mgs.md, ``make demo``).

CLI: ``python -m fairseq_ext.synthetic.completion OUT_DIR [--train N --valid N --test N --seed S]``
writes ``OUT_DIR/{train,valid,test}.txt`` (one line a sequence, for ``--task
text_completion``).
"""
import argparse
import os
import random
from typing import List, Sequence

WORDS = ["ka", "lo", "mi", "nu", "re", "sa", "ti", "vo", "ze", "pu", "gi", "ba"]
CYCLES = [[0, 1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11]]  # indices into WORDS; s(a) = the next in a's cycle
DOMINANT = 0.6
STOP_HIGH, STOP_LOW = 0.5, 0.25
MIN_WORDS = 4  # no stop before the 4th word, so every line is longer than a 3-word prefix


def successor() -> List[int]:
    """s(a) for every word index a."""
    s = [0] * len(WORDS)
    for cycle in CYCLES:
        for i, a in enumerate(cycle):
            s[a] = cycle[(i + 1) % len(cycle)]
    return s


def stop_probability() -> List[float]:
    """p(a): the probability that the line ends after word a (from ``MIN_WORDS`` on)."""
    p = [STOP_LOW] * len(WORDS)
    for a in CYCLES[0]:
        p[a] = STOP_HIGH
    return p


def sample_line(rng: random.Random, max_words: int = 60) -> str:
    """One line: a walk of the chain (first word uniform) ended by '.'."""
    s, p = successor(), stop_probability()
    n = len(WORDS)
    a = rng.randrange(n)
    walk = [a]
    while len(walk) < max_words:
        if len(walk) >= MIN_WORDS and rng.random() < p[a]:
            break
        a = s[a] if rng.random() < DOMINANT else rng.choice([b for b in range(n) if b != s[a]])
        walk.append(a)
    return " ".join(WORDS[b] for b in walk) + " ."


def write_completion_data(out_dir: str, sizes: Sequence[int] = (4000, 200, 200), seed: int = 1) -> str:
    """Write ``out_dir/{train,valid,test}.txt`` (see the module docstring); returns ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    for i, (split, n) in enumerate(zip(("train", "valid", "test"), sizes)):
        rng = random.Random(seed * 1000 + i)
        with open(os.path.join(out_dir, f"{split}.txt"), "w") as f:
            f.writelines(sample_line(rng) + "\n" for _ in range(n))
    return out_dir


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--train", type=int, default=4000)
    p.add_argument("--valid", type=int, default=200)
    p.add_argument("--test", type=int, default=200)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    write_completion_data(a.out_dir, (a.train, a.valid, a.test), a.seed)
    print(f"wrote text-completion toy data ({a.train}/{a.valid}/{a.test} lines) to {a.out_dir}")


if __name__ == "__main__":
    main()
