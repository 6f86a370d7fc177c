"""The user's own metric as the task loss: a cost class in the user's module, named by
import path in --mgs-task-loss / --mrt-task-loss / --pg-task-loss (alone or in a weighted
sum); the source beside each hypothesis (aligned with it), a neural cost's set-up on the
training device, its per-batch preparation reused across candidate sets, its chunks and
no_grad; errors naming the option. The costs are tests/user_costs.py."""
import os

import pytest
import torch

import user_costs
from conftest import REPO, run_cli_batch
from fairseq_ext.core.task_losses import TASK_LOSSES, task_loss_class
from fairseq_ext.decoding.batch import decode_batch
from fairseq_ext.decoding.candidates import DecodeConfig
from fairseq_ext.scoring.teacher_forced import sequence_log_probs
from fairseq_ext.costs.batch_scorer import BatchScorer, parse_cost_spec
from fairseq_ext.runtime.cli import ConfigError

TESTS = os.path.join(REPO, "tests")


@pytest.fixture
def batch(untrained_models):
    task, model = untrained_models["transformer"]
    task.load_dataset("valid")
    ds = task.dataset("valid")
    return task, model, ds.collater([ds[i] for i in range(5)])


def words(dictionary, ids):
    return dictionary.string(ids[ids.ne(dictionary.pad())]).split()


def test_cost_by_import_path_gives_the_hand_value(batch):
    """|words(hypothesis) - words(source)| / 10, by hand from the dictionaries; the
    references scored as hypotheses, in the batch's order."""
    task, _, sample = batch
    scorer = BatchScorer(task, "user_costs:LengthGap=2,edit=1", post_process="none")
    refs = scorer.references(sample)
    total, per = scorer.score(refs, torch.arange(len(refs)), sample)
    expected = [abs(len(words(task.target_dictionary, y)) - len(words(task.source_dictionary, x))) / 10
                for y, x in zip(sample["target"], sample["net_input"]["src_tokens"])]
    assert per["user_costs:LengthGap"].tolist() == pytest.approx(expected)
    assert per["edit"].tolist() == [0.0] * len(refs)  # the references against themselves
    assert total.tolist() == pytest.approx([2 * e for e in expected])
    assert task_loss_class("user_costs:LengthGap") is user_costs.LengthGap


def test_each_hypothesis_gets_its_own_source(batch):
    """Hypotheses answering the inputs in a scrambled order (as candidate sets do): each
    cost sees the source of the input its hypothesis answers, as dictionary symbols."""
    task, _, sample = batch
    scorer = BatchScorer(task, "user_costs:SourceWords", post_process="none")
    order = torch.tensor([3, 0, 0, 4, 1, 2, 3])
    refs = scorer.references(sample)
    costs = scorer.score([refs[i] for i in order], order, sample)[0]
    src = sample["net_input"]["src_tokens"]
    # source symbols without padding and EOS
    expected = [float(len(words(task.source_dictionary, src[i]))) for i in order]
    assert costs.tolist() == expected and len(set(expected)) > 1


def test_neural_cost_set_up_once_prepared_once_per_batch_in_chunks_without_grad(batch):
    """MGS scores one batch K + 1 times: the sources are encoded once for it and again
    only for a new batch; the costs equal a fresh scorer's; every chunk has at most
    batch_size hypotheses and runs without autograd; the time is counted."""
    task, model, sample = batch
    scorer = BatchScorer(task, "user_costs:EmbeddingDistance")
    cost = scorer.costs["user_costs:EmbeddingDistance"].loss
    cfg = DecodeConfig(max_len_b=6)
    ds = task.dataset("valid")
    other = ds.collater([ds[i] for i in range(5, 9)])
    for s in (sample, sample, sample, other):
        decoded = decode_batch(model, s, cfg)
        cand, b = decoded.candidates, decoded.batch
        with torch.enable_grad():
            costs = scorer.score(cand.as_list(), cand.source_index, b)[0]
        fresh = BatchScorer(task, "user_costs:EmbeddingDistance").score(cand.as_list(), cand.source_index, b)[0]
        assert torch.allclose(costs, fresh)
    assert cost.calls["setup"] == 1 and cost.calls["prepare"] == 2
    assert max(cost.calls["chunks"]) <= 3 and not any(cost.calls["grad"])
    assert scorer.seconds > 0
    # by hand for one hypothesis: 1 - cos(mean embedding of the hypothesis, of the source)
    h, x = cand.as_list()[0], [t for t in b["net_input"]["src_tokens"][cand.source_index[0]]
                                if t != task.source_dictionary.pad()]
    e = cost.embed.weight
    want = 1 - torch.nn.functional.cosine_similarity(e[h].mean(0), e[torch.stack(x)].mean(0), dim=0)
    assert costs[0].item() == pytest.approx(want.item(), abs=1e-6)


def test_cost_on_a_device_it_names(batch):
    """A cost whose ``device`` is not the training device is set up there, once, and receives its
    ids there; its costs come back beside the hypotheses (the lengths of the references)."""
    task, _, sample = batch
    scorer = BatchScorer(task, "user_costs:OnItsOwnDevice")
    refs = scorer.references(sample)
    for _ in range(2):
        costs = scorer.score(refs, torch.arange(len(refs)), sample)[0]
    assert costs.tolist() == [float(len(r)) for r in refs] and costs.device.type == "cpu"
    assert user_costs.OnItsOwnDevice.seen == {"setup": [torch.device("meta")], "hyps": {torch.device("meta")}}


def test_frozen_model_nll_is_the_models_sequence_log_probability(batch, monkeypatch):
    """examples/mgs/my_costs.py's FrozenModelNLL with an encoder-decoder scorer (sources encoded
    once, in prepare; one hypothesis at a time) against the package's batched, padded
    sequence_log_probs of the same model: the references' -log p(y | x), in the batch's order."""
    monkeypatch.syspath_prepend(os.path.join(REPO, "examples", "mgs"))
    import my_costs

    task, model, sample = batch

    class Given(my_costs.FrozenModelNLL):
        def __init__(self):
            self.model, self.dictionary = model, task.target_dictionary

    was_training = model.training
    model.eval()
    try:
        cost, scorer = Given(), BatchScorer(task, "edit")
        refs = scorer.references(sample)
        sources = scorer.sources(sample)
        with torch.no_grad():
            want = -sequence_log_probs(model, sample, refs, torch.arange(len(refs)))
        got = cost(refs, None, sources, cost.prepare(None, sources))
    finally:
        model.train(was_training)
    assert len(set(len(x) for x in sources)) > 1 and len(set(len(y) for y in refs)) > 1  # padding on both sides
    assert got.tolist() == pytest.approx(want.tolist(), abs=1e-4)


@pytest.mark.parametrize("spec,message", [
    ("no_such_module:Cost", "'no_such_module' does not import (No module named 'no_such_module'); is its folder "
                            "on PYTHONPATH?"),
    ("user_costs:Missing", "module 'user_costs' has no 'Missing'"),
    ("user_costs:not_a_cost", "'user_costs:not_a_cost' is a function, not a subclass of "
                              "fairseq_ext.core.task_losses.TaskLoss"),
    ("user_costs:", "'user_costs:' is not an import path module:Class"),
    ("sbleu=1,no_such_module:Cost=0.5", "'no_such_module' does not import"),
    ("user_costs:LengthGap=x", "the weight of 'user_costs:LengthGap' is not a number: 'x'"),
    ("user_costs:NowhereDevice", "device must be None or a torch device such as 'cpu' or 'cuda:1', got 'nowhere'"),
])
def test_bad_import_path_is_one_error_naming_the_option(spec, message):
    with pytest.raises(ConfigError) as err:
        parse_cost_spec(spec, "--mrt-task-loss")
    assert str(err.value).startswith("--mrt-task-loss must be a task loss or a weighted sum of them (")
    assert message in str(err.value) and "\n" not in str(err.value)
    assert "user_costs:Missing" not in TASK_LOSSES and "user_costs:not_a_cost" not in TASK_LOSSES


def test_fairseq_train_with_a_cost_from_the_users_module(toy_bin, tmp_path):
    """Through fairseq-train, with the user's folder on PYTHONPATH: MRT and MGS train on a
    source-aware cost and log its time per update; a cost that does not import stops the
    command before training, one line naming the option, nothing written."""
    common = ["fairseq-train", toy_bin, "--user-dir", "fairseq_ext", "--arch", "transformer",
              "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
              "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
              "--decoder-attention-heads", "2", "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "500",
              "--max-update", "2", "--disable-validation", "--no-save", "--num-workers", "0", "--log-format", "json",
              "--log-interval", "1"]
    env = {"PYTHONPATH": os.pathsep.join([REPO, TESTS])}
    runs = run_cli_batch([
        {"argv": common + ["--criterion", "mrt", "--mrt-task-loss", "user_costs:LengthGap=1,sbleu=0.5",
                           "--save-dir", str(tmp_path / "mrt")], "env": env},
        {"argv": common + ["--criterion", "mgs", "--mgs-task-loss", "user_costs:EmbeddingDistance",
                           "--mgs-candidates", "2", "--save-dir", str(tmp_path / "mgs")], "env": env},
        {"argv": common + ["--criterion", "pg", "--pg-task-loss", "my_missing_costs:Quality",
                           "--save-dir", str(tmp_path / "bad")], "env": env},
    ], tmp_path)
    for run in runs[:2]:
        assert run["rc"] == 0, run["stderr"][-3000:]
        assert '"train_cost_seconds"' in run["stdout"] + run["stderr"]
    bad = runs[2]
    lines = [line for line in bad["stderr"].splitlines() if "error" in line.lower()]
    assert bad["rc"] == 2 and len(lines) == 1 and lines[0].startswith("fairseq-train: error: --pg-task-loss must be ")
    assert lines[0].endswith("'my_missing_costs' does not import (No module named 'my_missing_costs'); is its "
                             "folder on PYTHONPATH?")
    assert not (tmp_path / "bad").exists()
