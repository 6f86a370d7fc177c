"""Task ``translation_mbr``: fairseq's ``translation`` whose fairseq-generate decodes by
minimum Bayes risk (``fairseq_ext/generators/mbr_generator.py``, the math in
``fairseq_ext/core/mbr.py``) under any plugin cost, the costs MGS, MRT and PG train on.

Train with ``--task translation`` (or this task: training is translation's) and decode any
translation checkpoint:

    fairseq-generate DATA --user-dir "$(fairseq-ext-dir)" --task translation_mbr --path ckpt.pt \\
        --mbr-num-candidates 32 --mbr-task-loss chrf --post-process sentencepiece

docs/mbr.md documents the options.
"""
from dataclasses import dataclass, field
from typing import Optional

from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from omegaconf import II, OmegaConf

from fairseq_ext.core.constraints import Rule, at_least
from fairseq_ext.core.mbr import prune
from fairseq_ext.core.sampling import choose_tokens, filter_logits
from fairseq_ext.core.task_losses import TASK_LOSS_SPEC
from fairseq_ext.costs.batch_scorer import TASK_LOSS_HELP
from fairseq_ext.costs.sequence_cost import POST_PROCESS_HELP
from fairseq_ext.generators.mbr_generator import CANDIDATES, REFERENCES, MBRGenerator
from fairseq_ext.runtime.cli import ConfigError
from fairseq_ext.runtime.validation import check_options
from fairseq_ext.tasks.batching import TaskBatching


def _schedule_ok(value) -> bool:
    try:
        steps = [int(x) for x in str(value).split(",") if x.strip()]
    except ValueError:
        return False
    return bool(steps) and all(s >= 1 for s in steps)


SCHEDULE = Rule(_schedule_ok, "a comma-separated list of reference counts >= 1 (8,16,32)", "8,x")


@dataclass
class TranslationMBRConfig(TranslationConfig):
    mbr_candidates: ChoiceEnum(list(CANDIDATES)) = field(
        default="epsilon", metadata={"help": "where the candidates come from: epsilon = epsilon sampling (Hewitt et "
                                             "al., 2022; --mbr-epsilon), sample = ancestral sampling (with "
                                             "--mbr-topk / --mbr-topp: top-k / nucleus), beam = the n-best of a beam "
                                             "of --mbr-num-candidates, file = --mbr-candidates-file"})
    mbr_num_candidates: int = field(default=32, metadata={"help": "N: candidates per sentence (samples, or the beam "
                                                                  "size and n-best for beam)",
                                                          "constraint": at_least(1)})
    mbr_epsilon: float = field(default=0.02, metadata={"help": "epsilon sampling: tokens of probability below this "
                                                               "are never drawn (Freitag et al., 2023: 0.02)",
                                                       "parameter": (filter_logits, "epsilon")})
    mbr_topk: int = field(default=0, metadata={"help": "sample from the k most probable tokens (0: all)",
                                               "parameter": (filter_logits, "topk")})
    mbr_topp: float = field(default=1.0, metadata={"help": "sample from the nucleus of this probability (1: off)",
                                                   "parameter": (filter_logits, "topp")})
    mbr_temperature: float = field(default=1.0, metadata={"help": "sampling temperature (the filters apply to the "
                                                                  "tempered distribution)",
                                                          "parameter": (choose_tokens, "temperature")})
    mbr_candidates_file: Optional[str] = field(
        default=None, metadata={"help": "with --mbr-candidates file: the H- lines of a fairseq-generate output "
                                        "written without --post-process, or lines ID<TAB>SYMBOLS"})
    mbr_references: ChoiceEnum(list(REFERENCES)) = field(
        default="candidates", metadata={"help": "pseudo-references: the candidates themselves, or a separate sample "
                                                "(--mbr-num-references, drawn as the candidates are sampled)"})
    mbr_num_references: Optional[int] = field(default=None, metadata={
        "help": "with --mbr-references sample: how many (default: --mbr-num-candidates)", "constraint": at_least(1)})
    mbr_task_loss: str = field(default="chrf", metadata={
        "help": TASK_LOSS_HELP.format(what="the cost C whose expectation under the model is minimised (utility = "
                                           "1 - C); a cost that reads no reference reranks by itself (QE)"),
        "constraint": TASK_LOSS_SPEC})
    mbr_prefilter_task_loss: Optional[str] = field(default=None, metadata={
        "help": "QE pre-filtering: a reference-free cost (e.g. reverse(model=PATH), my_costs:Quality) that ranks the "
                "distinct candidates; MBR then chooses among the --mbr-prefilter-k best of them, against every "
                "pseudo-reference (default: no pre-filtering)", "constraint": TASK_LOSS_SPEC})
    mbr_prefilter_k: Optional[int] = field(default=None, metadata={
        "help": "with --mbr-prefilter-task-loss: how many candidates MBR keeps", "constraint": at_least(1)})
    mbr_post_process: str = field(default="auto", metadata={"help": POST_PROCESS_HELP})
    mbr_score_model: Optional[str] = field(default=None, metadata={
        "help": "checkpoint of the lm cost's scorer (default: the decoded model itself)"})
    mbr_aggregate: bool = field(default=False, metadata={
        "help": "reference aggregation: each candidate against the expected n-gram counts of all references (sbleu, "
                "chrf) or their mean embedding (comet with a regression model, EmbeddingCost): N cost evaluations per "
                "sentence instead of N x M"})
    mbr_prune_alpha: Optional[float] = field(default=None, metadata={
        "help": "confidence-based pruning (Cheng & Vlachos, 2023): after each step of --mbr-prune-schedule, drop "
                "the candidates whose bootstrap win rate is <= 1 - alpha (0.99 in the paper; default: no pruning)",
        "parameter": (prune, "alpha")})
    mbr_prune_schedule: str = field(default="8,16,32,64,128,256", metadata={
        "help": "pruning: the reference counts of its steps (the last step uses every reference)",
        "constraint": SCHEDULE})
    mbr_prune_bootstrap: int = field(default=500, metadata={"help": "pruning: bootstrap resamples per step",
                                                            "parameter": (prune, "bootstrap")})
    mbr_output_file: Optional[str] = field(default=None, metadata={
        "help": "write, per sentence, the distinct candidates, their counts and risks, the references and the order "
                "as JSON lines here"})
    mbr_output_matrix: bool = field(default=False, metadata={
        "help": "also write the cost matrix (candidates x references) in --mbr-output-file"})
    seed: int = II("common.seed")
    num_shards: int = II("dataset.num_shards")  # fairseq-generate --num-shards (tasks/batching.py)
    shard_id: int = II("dataset.shard_id")


def check_mbr_options(cfg) -> None:
    """The rules that tie options together; one line naming the option."""
    kind = str(cfg.mbr_candidates)
    if kind == "file" and not cfg.mbr_candidates_file:
        raise ConfigError("--mbr-candidates file needs --mbr-candidates-file")
    if cfg.mbr_candidates_file and kind != "file":
        raise ConfigError(f"--mbr-candidates-file is read only with --mbr-candidates file (got {kind})")
    if cfg.mbr_num_references is not None and str(cfg.mbr_references) != "sample":
        raise ConfigError("--mbr-num-references needs --mbr-references sample")
    if (cfg.mbr_prefilter_task_loss is None) != (cfg.mbr_prefilter_k is None):
        raise ConfigError("--mbr-prefilter-task-loss and --mbr-prefilter-k go together")
    if cfg.mbr_aggregate and cfg.mbr_prune_alpha is not None:
        raise ConfigError("--mbr-aggregate and --mbr-prune-alpha are two ways to cut the cost; choose one")
    if cfg.mbr_output_matrix and not cfg.mbr_output_file:
        raise ConfigError("--mbr-output-matrix needs --mbr-output-file")


@register_task("translation_mbr", dataclass=TranslationMBRConfig)
class TranslationMBRTask(TaskBatching, TranslationTask):
    """``translation`` with minimum Bayes risk decoding as fairseq-generate's generator."""

    cfg: TranslationMBRConfig

    def __init__(self, cfg: TranslationMBRConfig, src_dict, tgt_dict):
        check_options(TranslationMBRConfig, cfg)
        check_mbr_options(cfg)
        super().__init__(cfg, src_dict, tgt_dict)
        self._text = {"bpe": None, "tokenizer": None}

    def build_tokenizer(self, args):
        self._text["tokenizer"] = args  # the text costs detokenize as fairseq-generate does
        return super().build_tokenizer(args)

    def build_bpe(self, args):
        self._text["bpe"] = args
        return super().build_bpe(args)

    def text_config(self):
        """fairseq-generate's ``--tokenizer`` and ``--bpe``, as ``costs.sequence_cost.text_tools`` reads them."""
        return OmegaConf.create({k: v for k, v in self._text.items()})

    def build_generator(self, models, args, **kwargs):
        return MBRGenerator(models, self, self.cfg, args)
