"""The residual EBM's designed check (fairseq_ext/synthetic/residual.py,
examples/residual_ebm/distinct.sh) at small size, through fairseq-train,
scripts/prepare/sample_negatives.py and scripts/score/eval_residual.py: continuations never repeat
a word and their exact perplexity is known; a small base LM trained briefly does
not know the constraint; the joint model P_LM exp(-E) / Z must repair both."""
import json
import math
import os

import pytest

from conftest import run_cli
from fairseq_ext.synthetic import residual


def test_generator_and_truth_by_hand(tmp_path):
    residual.write(str(tmp_path), vocab=5, prefix_len=3, continuation_len=4, sizes={"train": 50}, seed=2)
    lines = (tmp_path / "train.txt").read_text().splitlines()
    assert len(lines) == 50 and all(len(line.split()) == 6 for line in lines)
    assert all(len(set(line.split()[3:])) == 3 for line in lines)  # 3 distinct words, then <eos>
    # 1 / (5 * 4 * 3) over 4 tokens
    assert residual.true_perplexity(5, 4) == pytest.approx(60 ** 0.25)
    assert residual.distinct_share([["a", "b", "a", "c"], ["a", "b"]]) == pytest.approx((0.75 + 1) / 2)


@pytest.mark.slow
def test_joint_model_repairs_what_the_base_lm_gets_wrong(tmp_path):
    """One seed of the recipe, reduced (8 words, 4 distinct per continuation, 2000
    lines, 8 EBM epochs at lr 0.003; about a minute of CPU). Measured with 6 epochs:
    distinct share 0.858 (base LM) -> 0.950 (joint), perplexity 5.32 -> 4.69 / 4.77
    against the truth 4.42 (examples/residual_ebm/README.md, "Designed check", has the 3-seed
    full-size numbers)."""
    work = str(tmp_path / "work")
    run_cli(["bash", "examples/residual_ebm/distinct.sh", work],
            env={"SEEDS": "1", "TRAIN": "2000", "VOCAB": "8", "L": "5", "EBM_LR": "0.003", "BATCH": "16",
                 "LM_UPDATES": "100", "EBM_EPOCHS": "8", "PATIENCE": "3", "EVAL_SAMPLES": "16", "JOINT": "16"})
    res = json.load(open(os.path.join(work, "s1", "eval.json")))
    recs = [json.loads(line) for line in open(os.path.join(work, "s1", "samples.jsonl"))]
    share = {k: residual.distinct_share([r[k].split() for r in recs]) for k in ("real", "base_lm", "joint")}
    truth = residual.true_perplexity(8, 5)
    assert share["real"] == 1.0
    assert share["base_lm"] < 0.95, share  # the base LM repeats words
    assert share["joint"] > share["base_lm"] + 0.05, share
    assert res["base_lm_ppl"] > truth + 0.5, (res["base_lm_ppl"], truth)
    # the joint model is closer to the truth than the base LM, by either log-Z estimate
    assert abs(math.log(res["joint_ppl_upper"] / truth)) < 0.6 * math.log(res["base_lm_ppl"] / truth), res
