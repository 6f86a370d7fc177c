"""fairseq checkpoints as costs: model-based metrics that run offline, on the training device,
without gradients.

* ``reverse(model=PATH)``, reference-free (noisy channel, Yee et al., 2019): the negative
  log-probability of the source given the hypothesis under a target -> source translation model,
  per source token (EOS included; ``normalize=false``: summed).
* ``paraphrase(model=PATH)``, reference-based (Prism, Thompson & Post, 2020): a translation model
  used as a paraphraser, minus the mean of log p(hypothesis | reference) and log p(reference |
  hypothesis), each per token; the model's two sides share one vocabulary (a joined dictionary).
* ``fluency(model=PATH)``, reference-free: the negative log-probability of the hypothesis under a
  target-side language model (``transformer_lm``), per token.

Each reads its own dictionaries, tokenizer and BPE from its checkpoint (the ``--tokenizer`` /
``--bpe`` it was trained with) and re-encodes the detokenized text as its data was encoded, so
its vocabulary need not be the trained model's. Texts are encoded once per batch (``prepare``:
the references and sources; candidate sets scored against them reuse the encodings) and scored
``batch_size`` pairs per forward. Scores are fairseq's own (``get_normalized_probs`` of a
teacher-forced forward, as ``fairseq-generate --score-reference`` scores a pair).
"""
from typing import List, Optional, Sequence

import torch
from torch import Tensor

from fairseq_ext.core.task_losses import TaskLoss, register_task_loss
from fairseq_ext.scoring.teacher_forced import source_batch, token_log_probs


class CheckpointScorer:
    """A fairseq checkpoint that scores text: its model (eval mode, frozen), its dictionaries, and
    the tokenizer and BPE of its configuration."""

    def __init__(self, path: str):
        from fairseq import checkpoint_utils
        from fairseq.data import encoders

        try:
            models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path])
        except FileNotFoundError:
            raise ValueError(f"model={path}: no such checkpoint") from None
        self.model = models[0]
        self.model.eval()
        self.model.requires_grad_(False)
        self.source_dictionary = getattr(task, "source_dictionary", None)
        self.target_dictionary = task.target_dictionary
        self.left_pad_source = bool(getattr(cfg.task, "left_pad_source", True))
        self.tokenizer = encoders.build_tokenizer(cfg.tokenizer) if cfg.get("tokenizer") is not None else None
        self.bpe = encoders.build_bpe(cfg.bpe) if cfg.get("bpe") is not None else None
        self.encoder_decoder = getattr(self.model, "encoder", None) is not None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def encode(self, text: str, side: str = "target") -> Tensor:
        """A detokenized sentence as ids of the ``side`` dictionary (EOS appended), tokenized and
        segmented as the checkpoint's data was."""
        if self.tokenizer is not None:
            text = self.tokenizer.encode(text)
        if self.bpe is not None:
            text = self.bpe.encode(text)
        dictionary = self.source_dictionary if side == "source" else self.target_dictionary
        return dictionary.encode_line(text, add_if_not_exist=False, append_eos=True).long()

    def token_log_probs(self, targets: Sequence[Tensor], sources: Optional[Sequence[Tensor]] = None) -> List[Tensor]:
        """Per pair, log p(target_t | target_<t, source) of every target token (EOS included),
        teacher-forced in one forward (``scoring.teacher_forced``; a language model: ``sources``
        None, the targets continue nothing)."""
        d, device = self.target_dictionary, self.device
        targets = [t.to(device) for t in targets]
        if self.encoder_decoder:
            sample, index = source_batch([x.to(device) for x in sources], self.source_dictionary.pad(), d.eos(),
                                         left_pad=self.left_pad_source)
            lprobs = token_log_probs(self.model, sample, targets, index)
        else:
            empty = torch.zeros(len(targets), 0, dtype=torch.long, device=device)
            lprobs = token_log_probs(self.model, {"net_input": {"src_tokens": empty}}, targets,
                                     torch.arange(len(targets), device=device), prefix_tokens=empty)
        return [row[: len(t)].float() for row, t in zip(lprobs, targets)]


class _ModelCost(TaskLoss):
    """What the model-based costs share: a checkpoint, its device, the mean (or sum) of log-probs."""

    input_kind = "text"
    batch_size = 64
    name = ""

    def __init__(self, model: str, normalize: bool = True):
        if not isinstance(model, str) or not model:
            raise ValueError(f"{self.name}: model= must be the path of a fairseq checkpoint")
        self.scorer = CheckpointScorer(model)
        self.normalize = bool(normalize)

    def setup(self, device: torch.device) -> None:
        self.scorer.model.to(device)

    def _nll(self, targets: Sequence[Tensor], sources: Optional[Sequence[Tensor]] = None) -> Tensor:
        per_token = self.scorer.token_log_probs(targets, sources)
        return torch.stack([-(lp.mean() if self.normalize else lp.sum()) for lp in per_token])


@register_task_loss("reverse")
class ReverseModelCost(_ModelCost):
    """-log p(source | hypothesis) / |source| under a target -> source model (noisy channel)."""

    name = "reverse"
    needs_reference = False
    needs_source = True

    def prepare(self, refs, sources: List[str]) -> List[Tensor]:
        return [self.scorer.encode(x, "target") for x in sources]  # the source is the reverse model's target

    def batch_cost(self, hyps: List[str], refs, sources=None, prepared=None) -> Tensor:
        encoded = prepared if prepared is not None else [self.scorer.encode(x, "target") for x in sources]
        return self._nll(encoded, [self.scorer.encode(h, "source") for h in hyps])


@register_task_loss("paraphrase")
class ParaphraseCost(_ModelCost):
    """Prism's score as a cost: -(log p(hyp | ref) / |hyp| + log p(ref | hyp) / |ref|) / 2 under one
    translation model whose two sides share a vocabulary."""

    name = "paraphrase"
    needs_reference = True

    def __init__(self, model: str, normalize: bool = True):
        super().__init__(model, normalize)
        if self.scorer.source_dictionary is None or (
                self.scorer.source_dictionary.symbols != self.scorer.target_dictionary.symbols):
            raise ValueError(f"paraphrase: {model} must translate within one vocabulary (a joined dictionary: "
                             "fairseq-preprocess --joined-dictionary)")

    def prepare(self, refs: List[str], sources) -> List[Tensor]:
        return [self.scorer.encode(r) for r in refs]

    def batch_cost(self, hyps: List[str], refs: List[str], sources=None, prepared=None) -> Tensor:
        r = prepared if prepared is not None else [self.scorer.encode(x) for x in refs]
        h = [self.scorer.encode(x) for x in hyps]
        return (self._nll(h, r) + self._nll(r, h)) / 2


@register_task_loss("fluency")
class FluencyCost(_ModelCost):
    """-log p(hypothesis) / |hypothesis| under a target-side language model."""

    name = "fluency"
    needs_reference = False

    def __init__(self, model: str, normalize: bool = True):
        super().__init__(model, normalize)
        if self.scorer.encoder_decoder:
            raise ValueError(f"fluency: {model} is a translation model; it needs a language model "
                             "(--task language_modeling --arch transformer_lm)")

    def batch_cost(self, hyps: List[str], refs=None, sources=None, prepared=None) -> Tensor:
        return self._nll([self.scorer.encode(h) for h in hyps])
