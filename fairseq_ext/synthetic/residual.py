"""A generated corpus for the residual EBM where the truth is known and the base LM
is wrong in one measurable, sequence-level way.

Every line is a block of ``--prefix-len`` P words drawn independently and uniformly
from V words, followed by ``--continuation-len`` L - 1 words drawn uniformly
*without replacement* (all distinct), then <eos> (fairseq adds it), so that the
``residual_lm`` task's blocks of P + L tokens are exactly the lines. The
continuation's law is known in closed form:

    P_true(x_{P+1..P+L} | prefix) = prod_{i=0}^{L-2} 1 / (V - i)     (<eos> is certain)

so its exact perplexity per continuation token (the L tokens, <eos> included) is
exp(sum_{i<L-1} log(V - i) / L), and every true continuation has a share of
distinct words of 1. A left-to-right LM that has not learned the "no repeat"
constraint (a small one trained briefly) puts mass on repeats: its samples'
share of distinct words is below 1 and its perplexity above the truth. The joint
model P_LM exp(-E) / Z can fix both with a bidirectional energy (Deng et al., 2020,
section 4), and both are measured against the truth (examples/residual_ebm/distinct.sh).

    python -m fairseq_ext.synthetic.residual OUT_DIR [--vocab 12 --prefix-len 8 --continuation-len 6
        --train 4000 --valid 300 --test 300 --seed 1]
"""
import argparse
import math
import os
import random
from typing import Dict, List, Sequence


def words(vocab: int) -> List[str]:
    return [f"w{i}" for i in range(vocab)]


def make_lines(n: int, vocab: int, prefix_len: int, continuation_len: int, rng: random.Random) -> List[str]:
    """n lines of prefix_len iid words and continuation_len - 1 distinct words."""
    if not 1 <= continuation_len - 1 <= vocab:
        raise ValueError(f"--continuation-len must be in [2, vocab + 1], got {continuation_len}")
    w = words(vocab)
    return [" ".join([rng.choice(w) for _ in range(prefix_len)] + rng.sample(w, continuation_len - 1))
            for _ in range(n)]


def true_log_prob(vocab: int, continuation_len: int) -> float:
    """log P_true of any true continuation (its L tokens, <eos> included)."""
    return -sum(math.log(vocab - i) for i in range(continuation_len - 1))


def true_perplexity(vocab: int, continuation_len: int) -> float:
    """Exact perplexity per continuation token of the generator."""
    return math.exp(-true_log_prob(vocab, continuation_len) / continuation_len)


def distinct_share(continuations: Sequence[Sequence[str]]) -> float:
    """Mean over continuations of (distinct words) / (words); 1 for every true one."""
    shares = [len(set(c)) / len(c) for c in continuations if len(c)]
    return sum(shares) / max(1, len(shares))


def write(out_dir: str, vocab: int = 12, prefix_len: int = 8, continuation_len: int = 6,
          sizes: Dict[str, int] = None, seed: int = 1) -> str:
    """Write {train,valid,test}.txt; returns out_dir."""
    sizes = sizes or {"train": 4000, "valid": 300, "test": 300}
    rng = random.Random(seed)
    os.makedirs(out_dir, exist_ok=True)
    for split, n in sizes.items():
        with open(os.path.join(out_dir, f"{split}.txt"), "w") as f:
            f.writelines(line + "\n" for line in make_lines(n, vocab, prefix_len, continuation_len, rng))
    return out_dir


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--vocab", type=int, default=12)
    parser.add_argument("--prefix-len", type=int, default=8)
    parser.add_argument("--continuation-len", type=int, default=6, help="L: L - 1 distinct words, then <eos>")
    parser.add_argument("--train", type=int, default=4000)
    parser.add_argument("--valid", type=int, default=300)
    parser.add_argument("--test", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    write(args.out_dir, args.vocab, args.prefix_len, args.continuation_len,
          {"train": args.train, "valid": args.valid, "test": args.test}, args.seed)
    print(f"wrote {args.out_dir}: true perplexity per continuation token "
          f"{true_perplexity(args.vocab, args.continuation_len):.4f}, distinct share 1.0")


if __name__ == "__main__":
    main()
