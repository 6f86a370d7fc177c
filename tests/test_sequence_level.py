"""fairseq adapters of the task losses: fast text conversion equals Dictionary.string,
the lm cost equals a teacher-forced log-probability, BatchScorer caches references
per batch only, cost specs parse with clear errors."""
import pytest
import torch
from fairseq.data import Dictionary

from fairseq_ext.generators.candidates import DecodeConfig
from fairseq_ext.losses import LMScorerCost, SequenceCost
from fairseq_ext.sequence_level import BatchScorer, parse_cost_spec


def _dict():
    d = Dictionary()
    for w in ["▁the", "▁ca", "t", "▁sat", "@@", "x@@", "y"]:
        d.add_symbol(w)
    return d


@pytest.mark.parametrize("post_process", [None, "sentencepiece", "@@ "])
def test_text_matches_dictionary_string(post_process):
    d = _dict()
    cost = SequenceCost("sbleu", d, post_process=post_process)
    rows = [torch.tensor([d.bos(), 4, 5, 6, d.unk(), 7, d.eos(), d.pad()]), torch.tensor([9, 10, 8, d.eos()])]
    for r in rows:  # fairseq's callers strip padding before Dictionary.string; we drop it
        assert cost._text(r) == d.string(r[r.ne(d.pad())], post_process)


def test_symbols_keep_eos_only_for_nonterm():
    d = _dict()
    hyp = [torch.tensor([4, 5, d.eos()]), torch.tensor([4, 5, 6])]
    assert SequenceCost("nonterm", d)(hyp).tolist() == [0.0, 1.0]
    assert SequenceCost("edit", d)(hyp, [torch.tensor([4, 5, d.eos()])] * 2).tolist() == pytest.approx([0.0, 0.5])


def test_lm_cost_equals_teacher_forced(tiny_models):
    task, model = tiny_models["transformer"]
    d = task.target_dictionary
    src = [torch.tensor([5, 6, 7, d.eos()]), torch.tensor([8, d.eos()])]
    hyps = [torch.tensor([9, 10, d.eos()]), torch.tensor([11, d.eos()])]
    cost = LMScorerCost(model)(hyps, sources=src)
    model.eval()
    with torch.no_grad():
        for i in range(2):
            out = model(src[i].unsqueeze(0), torch.tensor([len(src[i])]), torch.cat([torch.tensor([d.eos()]), hyps[i][:-1]]).unsqueeze(0))
            lp = model.get_normalized_probs(out, log_probs=True)[0]
            expected = -lp.gather(-1, hyps[i].unsqueeze(-1)).sum()
            assert cost[i].item() == pytest.approx(expected.item(), abs=1e-4)


def test_batch_scorer_cache_follows_targets(tiny_models):
    task, model = tiny_models["transformer"]
    task.load_dataset("valid")
    ds = task.dataset("valid")
    a = ds.collater([ds[i] for i in range(4)])
    b = ds.collater([ds[i] for i in range(4, 8)])
    scorer = BatchScorer(task, "edit=1,rep=0.5")
    cfg = DecodeConfig(max_len_b=8)
    for sample in (a, b, a):
        cand, batch = scorer.decode(model, sample, cfg)
        total, per = scorer.score(cand.as_list(), cand.source_index, batch)
        fresh = BatchScorer(task, "edit=1,rep=0.5").score(cand.as_list(), cand.source_index, batch)[0]
        assert torch.allclose(total, fresh)
        assert torch.allclose(total, per["edit"] + 0.5 * per["rep"])


def test_parse_cost_spec():
    assert parse_cost_spec("sbleu") == {"sbleu": 1.0}
    assert parse_cost_spec("edit=1,rep=0.5") == {"edit": 1.0, "rep": 0.5}
    with pytest.raises(ValueError, match="unknown task loss 'bleurt'"):
        parse_cost_spec("bleurt")
    with pytest.raises(ValueError, match="not a number"):
        parse_cost_spec("edit=x")
    with pytest.raises(ValueError, match="twice"):
        parse_cost_spec("edit,edit")
