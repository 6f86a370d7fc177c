"""Task ``sequence_tagging``: CoNLL-2003 NER or POS tagging as seq2seq (Goyal
thesis sections 3.3.3, 4.5, 5.4.2).

Data: a directory with ``train.txt``, ``dev.txt`` and ``test.txt`` in CoNLL
columns (``token [POS] TAG`` per line, a blank line between sentences;
``-DOCSTART-`` document markers are dropped). fairseq's split ``valid`` reads
``dev.txt``, any other split ``{split}.txt``. ``--tagging-column ner`` takes the last
column as the label (9 BIO labels on CoNLL-2003), ``pos`` the second (45 tags).

A sentence of n words becomes the source ``w_1 .. w_n <eos>`` and the target
``y_1 .. y_n <eos>`` (equal lengths, as fairseq's ``translation`` with EOS
appended); batches are ``LanguagePairDataset`` batches (``prev_output_tokens`` =
``<eos> y_1 .. y_n``). Sources are right-padded unless ``--left-pad-source``.

Dictionaries and binarized splits are built on first use into a cache directory
(``--tagging-cache-dir``; default ``$XDG_CACHE_HOME/fairseq_ext/sequence_tagging`` or
``~/.cache/...``), never into the data directory, in a subdirectory keyed by the
raw files' contents and the options that change them (tag column, lowercasing,
digit normalisation, ``--tagging-min-word-count``,
``--tagging-max-train-sentences``). The word
dictionary comes from the training sentences used; the label dictionary holds
every label of the split files present (no unknown labels), with no extra
symbols. The cache subdirectory is a fairseq ``translation`` data directory
(languages ``words`` and ``tags``). Pass fairseq-generate the same task options
as fairseq-train, so that it finds the same dictionaries.

fairseq-generate's length limit is set to the source length (``--max-len-a``
and ``--max-len-b`` are ignored): a tagger never outputs more labels than words;
``--beam`` may not exceed the number of labels; batches are not rounded to a
multiple of ``--required-batch-size-multiple`` (see ``fairseq_ext/tasks/batching.py``).
"""
import argparse
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from fairseq import metrics, utils
from fairseq.data import Dictionary, LanguagePairDataset, data_utils, indexed_dataset
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import FairseqTask, register_task
from omegaconf import II

from fairseq_ext.runtime.cli import ConfigError
from fairseq_ext.runtime.validation import check_options
from fairseq_ext.core.constraints import at_least
from fairseq_ext.core.tagging_metrics import conlleval_counts, precision_recall_f1
from fairseq_ext.decoding.batch import decode_batch
from fairseq_ext.decoding.candidates import DecodeConfig
from fairseq_ext.generators.beam_generator import BeamSearchConfig, build_beam_generator
from fairseq_ext.tasks.batching import TaskBatching

logger = logging.getLogger(__name__)

SRC, TGT = "words", "tags"
CACHE_VERSION = 1
Sentence = Tuple[List[str], List[str]]


@dataclass
class SequenceTaggingConfig(BeamSearchConfig):
    data: Optional[str] = field(
        default=None, metadata={"help": "directory with train.txt, dev.txt, test.txt (CoNLL columns)"}
    )
    tagging_column: ChoiceEnum(["ner", "pos"]) = field(
        default="ner", metadata={"help": "label column: ner = last column, pos = second column",
                                 "deprecated": "--tag-column"})
    tagging_lowercase: bool = field(default=False, metadata={"help": "lowercase the words",
                                                             "deprecated": "--lowercase"})
    tagging_normalize_digits: bool = field(default=False, metadata={"help": "replace every digit of a word by 0",
                                                                    "deprecated": "--normalize-digits"})
    tagging_min_word_count: int = field(
        default=2,
        metadata={"help": "training words seen fewer times than this become <unk> (2: singletons train <unk>)",
                  "deprecated": "--min-word-count"})
    tagging_max_train_sentences: int = field(
        default=0, metadata={"help": "use only the first N training sentences (0: all)",
                             "deprecated": "--max-train-sentences"})
    tagging_cache_dir: Optional[str] = field(
        default=None,
        metadata={"help": "where dictionaries and binarized splits are cached "
                          "(default: $XDG_CACHE_HOME/fairseq_ext/sequence_tagging)", "deprecated": "--cache-dir"})
    left_pad_source: bool = field(default=False, metadata={"help": "left-pad source batches (default: right)"})
    tagging_eval: bool = field(
        default=False,
        metadata={"help": "validation also decodes (greedily, or as --tagging-eval-search says) and logs f1 "
                          "(conlleval chunks) and tag_acc (tokens); select checkpoints with "
                          "--best-checkpoint-metric f1 (or tag_acc) --maximize-best-checkpoint-metric",
                  "deprecated": "--eval-tagging"})
    tagging_eval_search: ChoiceEnum(["greedy", "hard", "soft"]) = field(
        default="greedy",
        metadata={"help": "--tagging-eval's decoder: greedy, or the hard / soft beam of --search-algorithm with "
                          "--tagging-eval-beam elements, --search-normalization and --search-alpha (select "
                          "checkpoints by the decoder used at test)", "deprecated": "--eval-tagging-search"})
    tagging_eval_beam: int = field(
        default=3, metadata={"help": "k of --tagging-eval-search hard / soft (at most the number of labels)",
                             "constraint": at_least(1), "deprecated": "--eval-tagging-beam"})
    max_source_positions: int = field(default=1024, metadata={"help": "longest source (words + <eos>)",
                                                              "constraint": at_least(1)})
    max_target_positions: int = field(default=1024, metadata={"help": "longest target (labels + <eos>)",
                                                              "constraint": at_least(1)})
    num_shards: int = II("dataset.num_shards")  # fairseq-generate --num-shards (tasks/batching.py)
    shard_id: int = II("dataset.shard_id")


def split_file(split: str) -> str:
    """CoNLL file name of a fairseq split: ``valid`` -> ``dev.txt``, else ``{split}.txt``."""
    return "dev.txt" if split == "valid" else f"{split}.txt"


def normalize_word(word: str, lowercase: bool, normalize_digits: bool) -> str:
    if lowercase:
        word = word.lower()
    if normalize_digits:
        word = re.sub(r"\d", "0", word)
    return word


def read_conll(path: str, tag_column: str, max_sentences: int = 0) -> List[Sentence]:
    """(words, labels) of each sentence of a CoNLL file.

    tag_column: ``ner`` (last column) or ``pos`` (second column; lines need at
    least 3 columns). ``-DOCSTART-`` lines are skipped. max_sentences > 0 keeps
    the first ones.
    """
    sentences: List[Sentence] = []
    words: List[str] = []
    labels: List[str] = []
    min_cols = 3 if tag_column == "pos" else 2
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            cols = line.split()
            if not cols:
                if words:
                    sentences.append((words, labels))
                    words, labels = [], []
                    if 0 < max_sentences <= len(sentences):
                        return sentences
                continue
            if cols[0] == "-DOCSTART-":
                continue
            if len(cols) < min_cols:
                raise ConfigError(f"{path}:{lineno}: expected at least {min_cols} columns for "
                                 f"--tagging-column {tag_column}, got {line.rstrip()!r}")
            words.append(cols[0])
            labels.append(cols[1] if tag_column == "pos" else cols[-1])
    if words and not (0 < max_sentences <= len(sentences)):
        sentences.append((words, labels))
    return sentences


def _digest(path: str) -> str:
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _cached_options(cfg: SequenceTaggingConfig) -> Dict[str, object]:
    """The options that change the dictionaries or binarized data, as the cache key names them."""
    return {"tag_column": str(cfg.tagging_column), "lowercase": cfg.tagging_lowercase,
            "normalize_digits": cfg.tagging_normalize_digits, "min_word_count": cfg.tagging_min_word_count,
            "max_train_sentences": cfg.tagging_max_train_sentences}


def cache_path(cfg: SequenceTaggingConfig) -> str:
    """The cache subdirectory for ``cfg``: keyed by the raw files' contents and
    the options that change dictionaries or binarized data."""
    root = cfg.tagging_cache_dir or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "fairseq_ext", "sequence_tagging"
    )
    files = {name: _digest(os.path.join(cfg.data, name))
             for name in ("train.txt", "dev.txt", "test.txt") if os.path.exists(os.path.join(cfg.data, name))}
    key = {
        "version": CACHE_VERSION, "files": files, **_cached_options(cfg)}
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    name = os.path.basename(os.path.normpath(os.path.abspath(cfg.data)))
    return os.path.join(root, f"{name}-{cfg.tagging_column}-{digest}")


@contextlib.contextmanager
def _staging(directory: str) -> Iterator[str]:
    """A temporary directory inside ``directory``, removed afterwards: files are
    written there, then renamed into place (safe with concurrent builders)."""
    tmp = tempfile.mkdtemp(dir=directory, prefix=".staging-")
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_indexed(sequences: Sequence[List[int]], vocab_size: int, prefix: str) -> None:
    """fairseq ``mmap`` indexed dataset ``prefix.{bin,idx}`` of integer sequences
    (the ``.idx`` appears last)."""
    with _staging(os.path.dirname(prefix)) as tmp:
        builder = indexed_dataset.make_builder(os.path.join(tmp, "d.bin"), impl="mmap", vocab_size=vocab_size)
        for seq in sequences:
            builder.add_item(torch.IntTensor(seq))
        builder.finalize(os.path.join(tmp, "d.idx"))
        os.replace(os.path.join(tmp, "d.bin"), prefix + ".bin")
        os.replace(os.path.join(tmp, "d.idx"), prefix + ".idx")


@register_task("sequence_tagging", dataclass=SequenceTaggingConfig)
class SequenceTaggingTask(TaskBatching, FairseqTask):
    """Tag CoNLL sentences with a seq2seq model; see the module docstring."""

    cfg: SequenceTaggingConfig
    forced_output_length = True  # one label per word: sequence-level criteria search the gold length

    def __init__(self, cfg: SequenceTaggingConfig, src_dict: Dictionary, tgt_dict: Dictionary, cache: str):
        super().__init__(cfg)
        check_options(SequenceTaggingConfig, cfg)
        self.src_dict = src_dict
        self.tgt_dict = tgt_dict
        self.cache = cache
        num_labels = len(tgt_dict) - tgt_dict.nspecial
        if cfg.tagging_eval and str(cfg.tagging_eval_search) != "greedy" and cfg.tagging_eval_beam > num_labels:
            raise ConfigError(f"--tagging-eval-beam must be <= {num_labels} (the number of labels), "
                              f"got {cfg.tagging_eval_beam}")

    @classmethod
    def setup_task(cls, cfg: SequenceTaggingConfig, **kwargs) -> "SequenceTaggingTask":
        if not cfg.data or not os.path.isfile(os.path.join(cfg.data, "train.txt")):
            raise FileNotFoundError(f"sequence_tagging: no train.txt in data directory {cfg.data!r}")
        cache = cache_path(cfg)
        os.makedirs(cache, exist_ok=True)
        paths = {lang: os.path.join(cache, f"dict.{lang}.txt") for lang in (SRC, TGT)}
        if not all(os.path.exists(p) for p in paths.values()):
            src_dict, tgt_dict = cls.build_dictionaries(cfg)
            options = {"data": os.path.abspath(cfg.data), **_cached_options(cfg)}
            with _staging(cache) as tmp:
                with open(os.path.join(tmp, "options.json"), "w", encoding="utf-8") as f:
                    json.dump(options, f, indent=2)
                src_dict.save(os.path.join(tmp, "src"))
                tgt_dict.save(os.path.join(tmp, "tgt"))
                os.replace(os.path.join(tmp, "options.json"), os.path.join(cache, "options.json"))
                os.replace(os.path.join(tmp, "src"), paths[SRC])
                os.replace(os.path.join(tmp, "tgt"), paths[TGT])
        src_dict, tgt_dict = Dictionary.load(paths[SRC]), Dictionary.load(paths[TGT])
        logger.info(f"sequence_tagging: {len(src_dict)} words, {len(tgt_dict) - tgt_dict.nspecial} labels "
                    f"(cache {cache})")
        return cls(cfg, src_dict, tgt_dict, cache)

    @staticmethod
    def build_dictionaries(cfg: SequenceTaggingConfig) -> Tuple[Dictionary, Dictionary]:
        """Word dictionary from the (first ``--tagging-max-train-sentences``) training
        sentences, words below ``--tagging-min-word-count`` dropped; label dictionary of all
        labels in the split files, sorted, specials first, no padding symbols."""
        train = read_conll(os.path.join(cfg.data, "train.txt"), cfg.tagging_column,
                           cfg.tagging_max_train_sentences)
        words = Dictionary()
        for sent_words, _ in train:
            for w in sent_words:
                words.add_symbol(normalize_word(w, cfg.tagging_lowercase, cfg.tagging_normalize_digits))
        words.finalize(threshold=cfg.tagging_min_word_count)
        label_counts: Dict[str, int] = {}
        for name in ("train.txt", "dev.txt", "test.txt"):
            path = os.path.join(cfg.data, name)
            if not os.path.exists(path):
                continue
            sentences = train if name == "train.txt" else read_conll(path, cfg.tagging_column)
            for _, sent_labels in sentences:
                for lab in sent_labels:
                    label_counts[lab] = label_counts.get(lab, 0) + int(name == "train.txt")
        labels = Dictionary()
        for lab in sorted(label_counts):
            labels.add_symbol(lab, n=label_counts[lab])
        return words, labels

    def _binarize(self, split: str, prefix: str) -> None:
        path = os.path.join(self.cfg.data, split_file(split))
        if not os.path.exists(path):
            raise FileNotFoundError(f"sequence_tagging: no {split_file(split)} in {self.cfg.data} for split {split!r}")
        max_sentences = self.cfg.tagging_max_train_sentences if split == "train" else 0
        sentences = read_conll(path, self.cfg.tagging_column, max_sentences)
        unknown = sorted({lab for _, labs in sentences for lab in labs if lab not in self.tgt_dict.indices})
        if unknown:
            raise ConfigError(f"sequence_tagging: {path} has labels missing from the label dictionary: {unknown}")
        norm = [[normalize_word(w, self.cfg.tagging_lowercase, self.cfg.tagging_normalize_digits) for w in words]
                for words, _ in sentences]
        eos = self.src_dict.eos()
        write_indexed([[self.tgt_dict.index(x) for x in labels] + [eos] for _, labels in sentences],
                      len(self.tgt_dict), f"{prefix}.{TGT}")
        # the source last: its .idx marks the split as complete
        write_indexed([[self.src_dict.index(w) for w in words] + [eos] for words in norm],
                      len(self.src_dict), f"{prefix}.{SRC}")
        logger.info(f"sequence_tagging: binarized {len(sentences)} sentences of {path}")

    def load_dataset(self, split: str, epoch: int = 1, combine: bool = False, **kwargs) -> None:
        prefix = os.path.join(self.cache, f"{split}.{SRC}-{TGT}")
        if not os.path.exists(f"{prefix}.{SRC}.idx"):
            self._binarize(split, prefix)
        src = data_utils.load_indexed_dataset(f"{prefix}.{SRC}", self.src_dict, "mmap")
        tgt = data_utils.load_indexed_dataset(f"{prefix}.{TGT}", self.tgt_dict, "mmap")
        if len(src) != len(tgt) or (src.sizes != tgt.sizes).any():
            raise ConfigError(f"sequence_tagging: {prefix}: source and target lengths differ")
        self.datasets[split] = LanguagePairDataset(
            src, src.sizes, self.src_dict, tgt, tgt.sizes, self.tgt_dict,
            left_pad_source=self.cfg.left_pad_source, left_pad_target=False,
        )

    def build_generator(self, models: Sequence, args, **kwargs):
        """fairseq's generator, with its length limit set to the source length.
        Beam search needs beam <= the number of labels: a one-word sentence has no
        more complete hypotheses than labels."""
        num_labels = len(self.tgt_dict) - self.tgt_dict.nspecial
        beam = getattr(args, "beam", 5)
        if not getattr(args, "sampling", False) and beam > num_labels:
            raise ConfigError(f"sequence_tagging: --beam {beam} is larger than the number of labels ({num_labels})")
        ours = build_beam_generator(self, models, self.tgt_dict, args, self.cfg)
        if ours is not None:
            return ours
        generator = super().build_generator(models, args, **kwargs)
        generator.max_len_a, generator.max_len_b = 1.0, 0
        return generator

    def valid_step(self, sample, model, criterion):
        """The criterion's validation loss; with ``--tagging-eval`` also conlleval's
        counts of greedy decodes against the gold labels."""
        loss, sample_size, logging_output = super().valid_step(sample, model, criterion)
        if self.cfg.tagging_eval:
            logging_output.update(self.tagging_counts(model, sample))
        return loss, sample_size, logging_output

    def tagging_counts(self, model, sample) -> Dict[str, int]:
        """Decodes of a batch (greedy, or ``--tagging-eval-search``'s beam) scored
        against its targets: chunk counts (gold, predicted, correct, all types) and
        token counts."""
        search = str(self.cfg.tagging_eval_search)
        if search == "greedy":
            hyps = decode_batch(model, sample, DecodeConfig(max_len_a=1.0, max_len_b=0)).candidates.as_list()
        else:
            generator = build_beam_generator(self, [model], self.tgt_dict, argparse.Namespace(
                beam=self.cfg.tagging_eval_beam), self.cfg, search, "--tagging-eval-search")
            was_training = model.training
            try:
                hyps = [h[0]["tokens"] for h in generator.generate([model], sample)]
            finally:
                model.train(was_training)
        gold, pred = [], []
        for hyp, ref in zip(hyps, sample["target"]):
            ref = ref[ref.ne(self.tgt_dict.pad())]
            gold.append(self.tgt_dict.string(ref).split())
            labels = self.tgt_dict.string(hyp).split()
            pred.append((labels + ["O"] * len(gold[-1]))[: len(gold[-1])])
        counts = conlleval_counts(gold, pred)
        return {"_tag_tokens": counts.tokens, "_tag_correct_tags": counts.correct_tags,
                "_tag_gold": sum(counts.gold.values()), "_tag_pred": sum(counts.pred.values()),
                "_tag_correct": sum(counts.correct.values())}

    def reduce_metrics(self, logging_outputs, criterion) -> None:
        super().reduce_metrics(logging_outputs, criterion)
        if not any("_tag_tokens" in log for log in logging_outputs):
            return
        for key in ("_tag_tokens", "_tag_correct_tags", "_tag_gold", "_tag_pred", "_tag_correct"):
            metrics.log_scalar_sum(key, utils.item(sum(log.get(key, 0) for log in logging_outputs)))

        def f1(meters):
            return round(precision_recall_f1(meters["_tag_correct"].sum, meters["_tag_pred"].sum,
                                             meters["_tag_gold"].sum)[2], 2)

        def accuracy(meters):
            tokens = meters["_tag_tokens"].sum
            return round(100.0 * meters["_tag_correct_tags"].sum / tokens, 2) if tokens else 0.0

        metrics.log_derived("f1", f1)
        metrics.log_derived("tag_acc", accuracy)

    def max_positions(self) -> Tuple[int, int]:
        return self.cfg.max_source_positions, self.cfg.max_target_positions

    @property
    def source_dictionary(self) -> Dictionary:
        return self.src_dict

    @property
    def target_dictionary(self) -> Dictionary:
        return self.tgt_dict
