"""The exposure-bias task: running sums modulo m (deterministic from a seed, no
download), and the position-wise scorer of its greedy outputs.

Source: steps x_1 .. x_n in [0, max_step] (default 2). Target: y_t = (x_1 + ...
+ x_t) mod m (default 10), so every target token is computable from the source
alone, but on gold prefixes it is also y_t = (y_{t-1} + x_t) mod m: one addition
of two visible tokens. A model trained only on gold prefixes (teacher forcing)
is rewarded for that shortcut through its own previous output, and at test time,
under greedy decoding, one wrong y_{t-1} makes every later y_t wrong by the same
offset (the error never washes out: the offset is carried forward exactly). A
model trained on its own decisions sees wrong y_{t-1} with a gold y_t computed
from the source, and is pushed towards the source route (or towards fewer early
mistakes). Nothing else in the task depends on the history: no ambiguity, no
reordering, target length = source length, so the gap between accuracy given the
gold prefix and greedy accuracy at late positions measures how errors compound,
i.e. exposure bias. Small steps matter: with x uniform in [0, m) the sum mod m
is independent of either addend alone, so there is no gradient signal until both
are used (a tiny LSTM learned nothing in 600 updates); with steps in {0, 1, 2}
y_t is within two of y_{t-1}. Source and target tokens are written as ``x2`` and
``y7`` (disjoint symbols in a joined dictionary).

CLI: ``python -m fairseq_ext.prefix_sum OUT_DIR [--train N --valid N --test N
--modulus M --min-len A --max-len B --seed S]`` writes
``OUT_DIR/{train,valid,test}.{src,tgt}`` for ``fairseq-preprocess``
(``binarize_translation`` in ``fairseq_ext.toy`` does that in-process).

``python -m fairseq_ext.prefix_sum --score GENERATE_OUTPUT [--json FILE]``
prints greedy token accuracy, whole-sequence accuracy and accuracy by target
position of a ``fairseq-generate`` output (its H- and T- lines).
"""
import argparse
import json
import os
import random
from typing import Dict, List, Sequence, Tuple


def prefix_sum_pair(rng: random.Random, modulus: int, max_step: int, min_len: int,
                    max_len: int) -> Tuple[str, str]:
    """One (source, target) pair: steps in [0, ``max_step``] and their running sums mod ``modulus``."""
    xs = [rng.randint(0, max_step) for _ in range(rng.randint(min_len, max_len))]
    ys, s = [], 0
    for x in xs:
        s = (s + x) % modulus
        ys.append(s)
    return " ".join(f"x{x}" for x in xs), " ".join(f"y{y}" for y in ys)


def write_prefix_sum_data(out_dir: str, sizes: Sequence[int] = (4000, 300, 300), modulus: int = 10,
                          max_step: int = 2, min_len: int = 4, max_len: int = 16, seed: int = 1) -> str:
    """Write ``{train,valid,test}.{src,tgt}`` (see the module docstring); returns ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    for i, (split, n) in enumerate(zip(("train", "valid", "test"), sizes)):
        rng = random.Random(seed * 1000 + i)
        pairs = [prefix_sum_pair(rng, modulus, max_step, min_len, max_len) for _ in range(n)]
        for ext, col in (("src", 0), ("tgt", 1)):
            with open(os.path.join(out_dir, f"{split}.{ext}"), "w") as f:
                f.writelines(p[col] + "\n" for p in pairs)
    return out_dir


def read_generate_output(text: str) -> Tuple[List[List[str]], List[List[str]]]:
    """(hypotheses, references) as token lists, ordered by sentence id, from the
    H- and T- lines of a ``fairseq-generate`` output."""
    hyps, refs = {}, {}
    for line in text.splitlines():
        if line.startswith("H-"):
            sid, _, toks = line[2:].split("\t", 2)
            hyps[int(sid)] = toks.split()
        elif line.startswith("T-"):
            sid, toks = line[2:].split("\t", 1)
            refs[int(sid)] = toks.split()
    ids = sorted(refs)
    missing = [i for i in ids if i not in hyps]
    if missing:
        raise ValueError(f"no hypothesis for sentence(s) {missing[:5]}")
    return [hyps[i] for i in ids], [refs[i] for i in ids]


def position_accuracy(hyps: Sequence[Sequence[str]], refs: Sequence[Sequence[str]]) -> Dict:
    """Greedy-output scores against references, position by position.

    ``token_acc``: the fraction of reference tokens y_t with hyp_t == y_t (a
    hypothesis shorter than its reference is wrong at the missing positions);
    ``seq_acc``: the fraction of hypotheses equal to their reference;
    ``by_position``: {t (1-based): accuracy at target position t over the
    references at least t long}; all in [0, 1]."""
    if len(hyps) != len(refs) or not refs:
        raise ValueError(f"need as many hypotheses as references (> 0), got {len(hyps)} and {len(refs)}")
    right, total, seq = 0, 0, 0
    pos_right: Dict[int, int] = {}
    pos_total: Dict[int, int] = {}
    for h, r in zip(hyps, refs):
        seq += list(h) == list(r)
        for t, y in enumerate(r, start=1):
            ok = t <= len(h) and h[t - 1] == y
            right += ok
            total += 1
            pos_right[t] = pos_right.get(t, 0) + ok
            pos_total[t] = pos_total.get(t, 0) + 1
    return {"token_acc": right / total, "seq_acc": seq / len(refs), "n": len(refs),
            "by_position": {t: pos_right[t] / pos_total[t] for t in sorted(pos_total)}}


def teacher_forced_by_position(checkpoint: str, data_dir: str, split: str) -> Dict[int, float]:
    """{t: accuracy of the argmax at target position t given the gold prefix}
    of a translation checkpoint on ``split`` of the binarized ``data_dir`` (EOS
    not counted): what the model gets right when its history is never wrong,
    to set beside ``position_accuracy`` of its greedy outputs."""
    import torch
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": data_dir})
    model = models[0].eval()
    task.load_dataset(split)
    ds = task.dataset(split)
    right, total = {}, {}
    with torch.no_grad():
        for start in range(0, len(ds), 100):
            sample = ds.collater([ds[i] for i in range(start, min(start + 100, len(ds)))])
            pred = model(**sample["net_input"])[0].argmax(-1)
            tgt = sample["target"]
            for t in range(tgt.size(1)):
                keep = tgt[:, t].ne(task.tgt_dict.pad()) & tgt[:, t].ne(task.tgt_dict.eos())
                right[t + 1] = right.get(t + 1, 0) + int((pred[:, t].eq(tgt[:, t]) & keep).sum())
                total[t + 1] = total.get(t + 1, 0) + int(keep.sum())
    return {t: right[t] / total[t] for t in sorted(total) if total[t]}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir", nargs="?", help="where to write the data")
    p.add_argument("--train", type=int, default=4000)
    p.add_argument("--valid", type=int, default=300)
    p.add_argument("--test", type=int, default=300)
    p.add_argument("--modulus", type=int, default=10)
    p.add_argument("--max-step", type=int, default=2)
    p.add_argument("--min-len", type=int, default=4)
    p.add_argument("--max-len", type=int, default=16)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--score", metavar="GENERATE_OUTPUT", help="score a fairseq-generate output instead")
    p.add_argument("--json", help="with --score: also write the scores here")
    a = p.parse_args(argv)
    if a.score:
        with open(a.score) as f:
            scores = position_accuracy(*read_generate_output(f.read()))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(scores, f)
        by_pos = " ".join(f"{t}:{v:.2f}" for t, v in scores["by_position"].items())
        print(f"token_acc {scores['token_acc']:.4f} seq_acc {scores['seq_acc']:.4f} n {scores['n']}\n"
              f"by position {by_pos}")
        return
    if not a.out_dir:
        p.error("give OUT_DIR (or --score FILE)")
    write_prefix_sum_data(a.out_dir, (a.train, a.valid, a.test), a.modulus, a.max_step, a.min_len, a.max_len, a.seed)
    print(f"wrote running sums mod {a.modulus} ({a.train}/{a.valid}/{a.test} pairs, "
          f"lengths {a.min_len}-{a.max_len}) to {a.out_dir}")


if __name__ == "__main__":
    main()
