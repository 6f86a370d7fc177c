"""Task ``text_completion``: decoder-only language models that continue a prefix.

Welleck & Cho (MGS paper, section 5.1): each line (paragraph) of the corpus is one
sequence; its first k tokens (``--completion-context-size``, k = 10) are the prefix X and the
rest, ended by <eos>, is the continuation Y. Lines of k tokens or fewer are
dropped. Training is MLE on the continuation (``--completion-loss continuation``)
or on the whole line (``line``); validation reports the continuation perplexity.

With ``fairseq-generate`` the model decodes a continuation from the prefix: the
S- line is the prefix, T- the reference continuation, H- the decoded continuation
(the forced prefix is stripped, and the H- score is the mean log-probability of
the continuation tokens).

Data: a directory made by ``scripts/prepare/prepare_wikitext_completion.py`` (``dict.txt``
and ``{train,valid,test}.{bin,idx}`` from ``fairseq-preprocess --only-source``).
"""
import logging
from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np
import torch
from fairseq.data import FairseqDataset, data_utils
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import register_task
from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask

from fairseq_ext.core.constraints import at_least
from fairseq_ext.runtime.validation import check_options
from fairseq_ext.tasks.batching import TaskBatching
from fairseq_ext.decoding.candidates import prefix_sample

logger = logging.getLogger(__name__)


@dataclass
class TextCompletionConfig(LanguageModelingConfig):
    completion_context_size: int = field(
        default=10, metadata={"help": "prefix length k in tokens; lines of <= k tokens are dropped (MGS section 5.1)",
                              "constraint": at_least(1), "deprecated": "--context-size"}
    )
    completion_loss: ChoiceEnum(["continuation", "line"]) = field(
        default="continuation",
        metadata={"help": "MLE on the continuation only (prefix targets masked) or on the whole line"},
    )


class CompletionDataset(FairseqDataset):
    """(prefix, continuation) pairs from a dataset of lines ``[w_1 .. w_n, eos]``.

    Item i: ``source`` = [eos, w_1 .. w_n] (decoder input), ``target`` =
    [w_1 .. w_n, eos] with the first k positions set to pad in continuation mode
    (target position j predicts w_{j+1}, so positions >= k are the continuation),
    ``prefix`` = [w_1 .. w_k].
    """

    def __init__(self, lines, dictionary, context_size: int, mask_prefix: bool):
        self.lines = lines
        self.dictionary = dictionary
        self.k = context_size
        self.mask_prefix = mask_prefix
        line_sizes = np.asarray(lines.sizes)  # includes eos
        self.keep = np.nonzero(line_sizes - 1 > context_size)[0]
        self.sizes = line_sizes[self.keep]
        dropped = len(line_sizes) - len(self.keep)
        if dropped:
            logger.info(f"text_completion: dropped {dropped} of {len(line_sizes)} lines with <= {context_size} tokens")

    def __getitem__(self, index: int) -> Dict:
        line = self.lines[int(self.keep[index])]
        eos = self.dictionary.eos()
        source = torch.cat([line.new([eos]), line[:-1]])
        target = line.clone()
        if self.mask_prefix:
            target[: self.k] = self.dictionary.pad()
        return {"id": index, "source": source, "target": target, "prefix": line[: self.k]}

    def __len__(self) -> int:
        return len(self.keep)

    def collater(self, samples: List[Dict]) -> Dict:
        if len(samples) == 0:
            return {}
        pad, eos = self.dictionary.pad(), self.dictionary.eos()

        def merge(key):
            return data_utils.collate_tokens([s[key] for s in samples], pad, eos, left_pad=False)

        src = merge("source")
        target = merge("target")
        return {
            "id": torch.LongTensor([s["id"] for s in samples]),
            "nsentences": len(samples),
            "ntokens": int(target.ne(pad).sum()),
            "net_input": {
                "src_tokens": src,
                "src_lengths": torch.LongTensor([s["source"].numel() for s in samples]),
            },
            "target": target,
            "prefix": torch.stack([s["prefix"] for s in samples]),
        }

    def num_tokens(self, index: int) -> int:
        return int(self.sizes[index])

    def size(self, index: int) -> int:
        return int(self.sizes[index])

    def ordered_indices(self):
        return np.argsort(self.sizes, kind="mergesort")

    @property
    def supports_prefetch(self) -> bool:
        return False


@register_task("text_completion", dataclass=TextCompletionConfig)
class TextCompletionTask(TaskBatching, LanguageModelingTask):
    """Continue a k-token prefix; see the module docstring."""

    # its batches carry the prompt as sample["prefix"] (target-side tokens), which decoded
    # candidates continue and source-aware costs read as their source (costs.batch_scorer)
    continues_prefixes = True

    def __init__(self, args, *rest, **kwargs):
        check_options(TextCompletionConfig, args)
        super().__init__(args, *rest, **kwargs)

    def load_dataset(self, split: str, epoch: int = 1, combine: bool = False, **kwargs):
        paths = self.args.data.split(":")
        path = f"{paths[(epoch - 1) % len(paths)]}/{split}"
        lines = data_utils.load_indexed_dataset(path, self.dictionary, self.args.dataset_impl, combine=combine)
        if lines is None:
            raise FileNotFoundError(f"text_completion: dataset not found: {split} ({path}.bin/.idx)")
        self.datasets[split] = CompletionDataset(
            lines, self.dictionary, self.args.completion_context_size,
            mask_prefix=self.args.completion_loss == "continuation",
        )

    def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None):
        """Decode continuations; rewrites ``sample`` in place so that fairseq-generate
        prints the prefix as S- and the reference continuation as T-."""
        if constraints is not None:
            raise NotImplementedError("constrained decoding is not supported by text_completion")
        pad, eos = self.dictionary.pad(), self.dictionary.eos()
        sample.update(prefix_sample(sample, pad, eos))
        prefix = sample["prefix"]
        k = prefix.size(1)
        with torch.no_grad():
            hypos = generator.generate(models, sample, prefix_tokens=prefix, bos_token=eos)
        for nbest in hypos:
            for h in nbest:
                h["tokens"] = h["tokens"][k:]
                h["positional_scores"] = h["positional_scores"][k:]
                h["score"] = h["positional_scores"].mean() if h["positional_scores"].numel() else h["score"]
                h["alignment"] = None
        return hypos
