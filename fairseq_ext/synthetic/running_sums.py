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

CLI: ``python -m fairseq_ext.synthetic.running_sums OUT_DIR [--train N --valid N --test N
--modulus M --min-len A --max-len B --seed S]`` writes
``OUT_DIR/{train,valid,test}.{src,tgt}`` for ``fairseq-preprocess``
(``binarize_translation`` in ``fairseq_ext.synthetic.toy`` does that in-process).

``python -m fairseq_ext.synthetic.running_sums --score GENERATE_OUTPUT [--json FILE]``
prints greedy token accuracy, whole-sequence accuracy and accuracy by target
position of a ``fairseq-generate`` output (its H- and T- lines).

``python -m fairseq_ext.synthetic.running_sums --corrupted-history CHECKPOINT --data BIN_DIR
[--split test] [--json FILE]`` prints how often a trained model recovers from
one wrong token in an otherwise gold history, and how often it carries the error
forward (``corrupted_history``).
"""
import argparse
import json
import os
import random
from typing import Dict, Sequence, Tuple

from fairseq_ext.evaluation.generate_output import Generated, read_generate_file


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


def position_accuracy(hyps: Sequence[Sequence[str]], refs: Sequence[Sequence[str]]) -> Dict:
    """Greedy-output scores against references, position by position.

    ``token_acc``: the fraction of reference tokens y_t with hyp_t == y_t (a
    hypothesis shorter than its reference is wrong at the missing positions);
    ``seq_acc``: the fraction of hypotheses equal to their reference;
    ``seq_correct``: 1 or 0 per hypothesis, equal to its reference or not (in
    input order, for paired tests);
    ``by_position``: {t (1-based): accuracy at target position t over the
    references at least t long}; all in [0, 1]."""
    if len(hyps) != len(refs) or not refs:
        raise ValueError(f"need as many hypotheses as references (> 0), got {len(hyps)} and {len(refs)}")
    right, total = 0, 0
    seq_correct = []
    pos_right: Dict[int, int] = {}
    pos_total: Dict[int, int] = {}
    for h, r in zip(hyps, refs):
        seq_correct.append(int(list(h) == list(r)))
        for t, y in enumerate(r, start=1):
            ok = t <= len(h) and h[t - 1] == y
            right += ok
            total += 1
            pos_right[t] = pos_right.get(t, 0) + ok
            pos_total[t] = pos_total.get(t, 0) + 1
    return {"token_acc": right / total, "seq_acc": sum(seq_correct) / len(refs), "n": len(refs),
            "by_position": {t: pos_right[t] / pos_total[t] for t in sorted(pos_total)},
            "seq_correct": seq_correct}


def score_generate_output(generated: Generated) -> Dict:
    """``position_accuracy`` of a fairseq-generate run (its H- and T- lines; see
    ``fairseq_ext.evaluation.generate_output``)."""
    return position_accuracy([h.split() for h in generated.raw], [r.split() for r in generated.references])


def _checkpoint_batches(checkpoint: str, data_dir: str, split: str, size: int = 100):
    """The model of a translation checkpoint (eval mode), its target dictionary and
    the collated batches of ``split`` of the binarized ``data_dir``."""
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": data_dir})
    task.load_dataset(split)
    ds = task.dataset(split)
    batches = [ds.collater([ds[i] for i in range(start, min(start + size, len(ds)))])
               for start in range(0, len(ds), size)]
    return models[0].eval(), task.tgt_dict, batches


def teacher_forced_by_position(checkpoint: str, data_dir: str, split: str) -> Dict[int, float]:
    """{t: accuracy of the argmax at target position t given the gold prefix}
    of a translation checkpoint on ``split`` of the binarized ``data_dir`` (EOS
    not counted): what the model gets right when its history is never wrong,
    to set beside ``position_accuracy`` of its greedy outputs."""
    import torch

    model, tgt_dict, batches = _checkpoint_batches(checkpoint, data_dir, split)
    right, total = {}, {}
    with torch.no_grad():
        for sample in batches:
            pred = model(**sample["net_input"])[0].argmax(-1)
            tgt = sample["target"]
            for t in range(tgt.size(1)):
                keep = tgt[:, t].ne(tgt_dict.pad()) & tgt[:, t].ne(tgt_dict.eos())
                right[t + 1] = right.get(t + 1, 0) + int((pred[:, t].eq(tgt[:, t]) & keep).sum())
                total[t + 1] = total.get(t + 1, 0) + int(keep.sum())
    return {t: right[t] / total[t] for t in sorted(total) if total[t]}


def corrupted_history(model, tgt_dict, batches, positions: Sequence[int] = range(3, 9), modulus: int = 10) -> Dict:
    """Recovery from one wrong token in an otherwise gold history. For every
    sentence and every c in ``positions`` with a y_{c+1}, the decoder is fed the
    gold prefix with y_c replaced by y_c + 1 (mod ``modulus``), and its argmax at
    position c + 1 is scored: ``recovered``, the share equal to the gold y_{c+1}
    (the running sum, computable from the source); ``followed``, the share equal
    to y_{c+1} + 1, what the shortcut y_{t-1} + x_t gives on the wrong history (the
    error carried forward). Teacher forcing never shows a wrong history; a model
    trained on its own outputs has seen them with the gold next token, so this is
    the mechanism scheduled sampling is meant to teach, measured directly.
    ``model(src_tokens, src_lengths, prev_output_tokens)`` returns (logits, ...),
    as a fairseq translation model does; ``batches`` are collated samples
    (right-padded targets, ``prev_output_tokens`` = EOS then the target)."""
    import torch

    index_of = torch.tensor([tgt_dict.index(f"y{v}") for v in range(modulus)])  # value -> dictionary index
    if bool(index_of.eq(tgt_dict.unk()).any()):
        raise ValueError(f"the target dictionary lacks some of y0 .. y{modulus - 1}: not running sums mod {modulus}")
    symbol = torch.full((len(tgt_dict),), -1, dtype=torch.long)  # dictionary index -> value (-1: not a y)
    symbol[index_of] = torch.arange(modulus)
    recovered = followed = n = 0
    with torch.no_grad():
        for sample in batches:
            tgt, net = sample["target"], sample["net_input"]
            for c in positions:
                if c < 1 or c >= tgt.size(1):
                    continue
                gold_c, gold_next = symbol[tgt[:, c - 1]], symbol[tgt[:, c]]
                keep = gold_c.ge(0) & gold_next.ge(0)
                if not keep.any():
                    continue
                prev = net["prev_output_tokens"].clone()
                assert bool(prev[keep, c].eq(tgt[keep, c - 1]).all()), "prev_output_tokens is not EOS + target"
                prev[keep, c] = index_of[(gold_c[keep] + 1) % modulus]
                pred = model(net["src_tokens"], net["src_lengths"], prev)[0][:, c].argmax(-1)[keep]
                recovered += int(pred.eq(tgt[keep, c]).sum())
                followed += int(pred.eq(index_of[(gold_next[keep] + 1) % modulus]).sum())
                n += int(keep.sum())
    if not n:
        raise ValueError(f"no sentence has a target position {min(positions) + 1} or later to score")
    return {"recovered": recovered / n, "followed": followed / n, "n": n, "positions": list(positions)}


def corrupted_history_of_checkpoint(checkpoint: str, data_dir: str, split: str, positions: Sequence[int] = range(3, 9),
                                    modulus: int = 10) -> Dict:
    """``corrupted_history`` of a translation checkpoint on ``split`` of the binarized ``data_dir``."""
    model, tgt_dict, batches = _checkpoint_batches(checkpoint, data_dir, split)
    return corrupted_history(model, tgt_dict, batches, positions, modulus)


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
    p.add_argument("--json", help="with --score or --corrupted-history: also write the scores here")
    p.add_argument("--corrupted-history", metavar="CHECKPOINT",
                   help="score a checkpoint's recovery from one wrong token in the gold history instead "
                        "(needs --data; positions 3-8 corrupted, one at a time)")
    p.add_argument("--data", help="with --corrupted-history: the binarized data directory")
    p.add_argument("--split", default="test", help="with --corrupted-history: the split to score (default test)")
    a = p.parse_args(argv)
    if a.corrupted_history:
        for path, what in ((a.corrupted_history, "--corrupted-history"), (a.data, "--data")):
            if not path or not os.path.exists(path):
                p.error(f"{what}: {path or 'missing'} does not exist")
        scores = corrupted_history_of_checkpoint(a.corrupted_history, a.data, a.split, modulus=a.modulus)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(scores, f)
        print(f"recovered {scores['recovered']:.4f} followed {scores['followed']:.4f} n {scores['n']}")
        return
    if a.score:
        scores = score_generate_output(read_generate_file(a.score))
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
