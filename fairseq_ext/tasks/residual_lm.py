"""Task ``residual_lm``: residual energy-based language models (Deng et al., 2020).

Examples are (prefix, continuation) blocks of the corpus read as one token stream
(the lines of the binarized split joined, each ended by <eos>), cut into
non-overlapping blocks of ``--residual-prefix-len`` + ``--residual-continuation-len``
tokens (paper: 120 + 40; CPU defaults 24 + 8); a last incomplete block is dropped. The base
language model P_LM (``--residual-base-lm``, a fairseq ``transformer_lm`` checkpoint
trained on the same dictionary) is loaded once, frozen, and used to sample
negatives (``scripts/prepare/sample_negatives.py``, offline), to initialise the ``unit``
energy model, to estimate log Z (``scripts/score/eval_residual.py``) and to propose
continuations for the joint sampler (Algorithm 1) under ``fairseq-generate``.

Negatives: ``{negatives-dir}/{split}.negatives.pt`` written by
``scripts/prepare/sample_negatives.py``: n base-LM continuations per block, aligned with
the blocks. In training, every positive gets ``--residual-num-negatives`` m of them drawn
uniformly without replacement (anew every epoch, as the paper samples from its
stored set); other splits take the first m.

Batches: ``positive`` (B, T) blocks, ``negatives`` (B, m, T) the same prefixes
with sampled continuations; ``net_input.src_tokens`` the prefixes (B, P) and
``target`` the human continuations (B, L), as fairseq-generate prints them.
"""
import logging
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import torch
from fairseq import checkpoint_utils
from fairseq.data import Dictionary, FairseqDataset, data_utils
from fairseq.dataclass import FairseqDataclass
from fairseq.tasks import FairseqTask, register_task
from omegaconf import II

from fairseq_ext.core.constraints import at_least
from fairseq_ext.core.sampling import filter_logits
from fairseq_ext.generators.joint_sampler import JointSampler
from fairseq_ext.runtime.cli import ConfigError
from fairseq_ext.runtime.validation import check_options
from fairseq_ext.tasks.batching import TaskBatching

logger = logging.getLogger(__name__)


@dataclass
class ResidualLMConfig(FairseqDataclass):
    data: Optional[str] = field(default=None, metadata={"help": "binarized data (dict.txt, {split}.bin/.idx)"})
    residual_base_lm: Optional[str] = field(
        default=None, metadata={"help": "fairseq transformer_lm checkpoint of the base LM P_LM (frozen); required",
                                "deprecated": "--base-lm"})
    residual_prefix_len: int = field(
        default=24, metadata={"help": "prefix tokens p (paper: 120)", "constraint": at_least(1),
                              "deprecated": "--prefix-len"})
    residual_continuation_len: int = field(
        default=8, metadata={"help": "continuation tokens T - p (paper: 40)", "constraint": at_least(1),
                             "deprecated": "--continuation-len"})
    residual_negatives_dir: Optional[str] = field(
        default=None, metadata={"help": "directory of {split}.negatives.pt (default: the data directory)",
                                "deprecated": "--negatives-dir"})
    residual_num_negatives: int = field(
        default=4, metadata={"help": "m negatives per positive in each batch, drawn from the n stored ones",
                             "constraint": at_least(1), "deprecated": "--num-negatives"})
    residual_joint_samples: int = field(
        default=16, metadata={"help": "n base-LM samples per prefix for the joint sampler (Algorithm 1)",
                              "parameter": (JointSampler, "n"), "deprecated": "--joint-samples"})
    residual_joint_topk: int = field(
        default=0, metadata={"help": "top-k of the base-LM proposals of the joint sampler (0: none, exact as n grows)",
                             "parameter": (filter_logits, "topk"), "deprecated": "--joint-topk"})
    residual_allow_topk_negatives: bool = field(
        default=False, metadata={"help": "accept negatives sampled with --topk > 0 (refused by default: NCE's noise "
                                         "is then not P_LM, so Theorem 1 and the log-Z evaluation do not hold)",
                                 "deprecated": "--allow-topk-negatives"})
    residual_energy_batch_size: int = field(
        default=64, metadata={"help": "sequences per energy-model forward when scoring samples",
                              "constraint": at_least(1), "deprecated": "--energy-batch-size"})
    seed: int = II("common.seed")
    num_shards: int = II("dataset.num_shards")  # fairseq-generate --num-shards (tasks/batching.py)
    shard_id: int = II("dataset.shard_id")


def load_base_lm(path: Optional[str], dictionary: Dictionary):
    """Load the frozen base LM from a fairseq checkpoint, checking it before any work:
    the file exists, it is a decoder-only LM, and its vocabulary is ``dictionary``.
    Returns the model in eval mode with ``requires_grad`` off."""
    from fairseq.models.transformer_lm import TransformerLanguageModel

    if not path:
        raise ConfigError("residual_lm needs --residual-base-lm PATH (a fairseq transformer_lm checkpoint)")
    if not os.path.isfile(path):
        raise ConfigError(f"--residual-base-lm: no such checkpoint file: {path}")
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    weights = state["model"]
    emb = weights.get("decoder.embed_tokens.weight")
    if emb is None or any(k.startswith("encoder.") for k in weights):
        raise ConfigError(f"--residual-base-lm {path}: not a decoder-only transformer_lm checkpoint")
    if emb.size(0) != len(dictionary):
        raise ConfigError(
            f"--residual-base-lm {path}: its vocabulary has {emb.size(0)} entries but the data dictionary has "
            f"{len(dictionary)}: the base LM must be trained on the same dict.txt"
        )
    ckpt_dict = os.path.join(str(getattr(state["cfg"].task, "data", "") or ""), "dict.txt")
    if os.path.isfile(ckpt_dict) and Dictionary.load(ckpt_dict).symbols != dictionary.symbols:
        raise ConfigError(f"--residual-base-lm {path}: its dictionary {ckpt_dict} differs from the data dictionary")

    class _Dicts:  # what TransformerLanguageModel.build_model reads from a task
        source_dictionary = target_dictionary = dictionary

    model = TransformerLanguageModel.build_model(state["cfg"].model, _Dicts())
    model.load_state_dict(weights, strict=True)
    model.eval()
    model.requires_grad_(False)
    return model


def token_blocks(lines, block_size: int) -> torch.Tensor:
    """The lines (each ending with eos) joined into one stream and cut into
    (N, block_size) non-overlapping blocks; the incomplete tail is dropped."""
    stream = torch.cat([lines[i] for i in range(len(lines))]) if len(lines) else torch.zeros(0, dtype=torch.long)
    n = stream.numel() // block_size
    return stream[: n * block_size].view(n, block_size).long()


class ResidualLMDataset(FairseqDataset):
    """Blocks (N, T) of prefix + human continuation, with optional stored
    negatives (N, n, L) of which ``num_negatives`` are returned per item."""

    def __init__(self, blocks: torch.Tensor, prefix_len: int, negatives: Optional[torch.Tensor],
                 num_negatives: int, shuffle_negatives: bool, seed: int):
        self.blocks = blocks
        self.p = prefix_len
        self.negatives = negatives
        self.m = num_negatives
        self.shuffle_negatives = shuffle_negatives
        self.seed = seed
        self.epoch = 1
        self.sizes = np.full(len(blocks), blocks.size(1), dtype=np.int64)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __getitem__(self, index: int) -> Dict:
        block = self.blocks[index]
        item = {"id": index, "positive": block}
        if self.negatives is not None:
            n = self.negatives.size(1)
            if self.shuffle_negatives:
                with data_utils.numpy_seed(self.seed, self.epoch, index):
                    pick = torch.from_numpy(np.random.choice(n, self.m, replace=False))
            else:
                pick = torch.arange(self.m)
            conts = self.negatives[index, pick].long()
            item["negatives"] = torch.cat([block[: self.p].expand(self.m, -1), conts], dim=1)
        return item

    def __len__(self) -> int:
        return len(self.blocks)

    def collater(self, samples: List[Dict]) -> Dict:
        if len(samples) == 0:
            return {}
        positive = torch.stack([s["positive"] for s in samples])
        bsz, cont = positive.size(0), positive.size(1) - self.p
        batch = {
            "id": torch.LongTensor([s["id"] for s in samples]),
            "nsentences": bsz,
            "ntokens": bsz * cont,
            "positive": positive,
            "net_input": {"src_tokens": positive[:, : self.p],
                          "src_lengths": torch.full((bsz,), self.p, dtype=torch.long)},
            "target": positive[:, self.p:],
        }
        if "negatives" in samples[0]:
            batch["negatives"] = torch.stack([s["negatives"] for s in samples])
        return batch

    def num_tokens(self, index: int) -> int:
        return int(self.sizes[index])

    def size(self, index: int) -> int:
        return int(self.sizes[index])

    def ordered_indices(self):
        return np.arange(len(self))

    @property
    def supports_prefetch(self) -> bool:
        return False


@register_task("residual_lm", dataclass=ResidualLMConfig)
class ResidualLMTask(TaskBatching, FairseqTask):
    """Residual EBM over a frozen base LM; see the module docstring."""

    def __init__(self, cfg: ResidualLMConfig, dictionary: Dictionary):
        super().__init__(cfg)
        self.dictionary = dictionary
        self._base_lm = load_base_lm(cfg.residual_base_lm, dictionary)
        self._negatives_for: Optional[str] = None  # who needs every split to have negatives

    @classmethod
    def setup_task(cls, cfg: ResidualLMConfig, **kwargs):
        check_options(ResidualLMConfig, cfg)
        if not cfg.data:
            raise ConfigError("residual_lm needs the data directory (positional argument)")
        dict_path = os.path.join(cfg.data.split(":")[0], "dict.txt")
        if not os.path.isfile(dict_path):
            raise FileNotFoundError(f"residual_lm: no dictionary {dict_path}")
        return cls(cfg, Dictionary.load(dict_path))

    @property
    def base_lm(self):
        """The frozen base LM (a ``TransformerLanguageModel``), on the CPU until moved."""
        return self._base_lm

    @property
    def source_dictionary(self) -> Dictionary:
        return self.dictionary

    @property
    def target_dictionary(self) -> Dictionary:
        return self.dictionary

    @property
    def block_size(self) -> int:
        return self.cfg.residual_prefix_len + self.cfg.residual_continuation_len

    def negatives_path(self, split: str) -> str:
        return os.path.join(self.cfg.residual_negatives_dir or self.cfg.data.split(":")[0], f"{split}.negatives.pt")

    def load_blocks(self, split: str) -> torch.Tensor:
        path = os.path.join(self.cfg.data.split(":")[0], split)
        lines = data_utils.load_indexed_dataset(path, self.dictionary, None)
        if lines is None:
            raise FileNotFoundError(f"residual_lm: dataset not found: {split} ({path}.bin/.idx)")
        blocks = token_blocks(lines, self.block_size)
        if len(blocks) == 0:
            raise ConfigError(f"residual_lm: split {split} has fewer than {self.block_size} tokens")
        return blocks

    def require_negatives(self, who: str) -> None:
        """From now on a split without negatives is refused when loaded (``who``, e.g.
        ``--criterion residual_nce``, trains on them); so is one loaded already."""
        self._negatives_for = who
        for split, dataset in self.datasets.items():
            if isinstance(dataset, ResidualLMDataset) and dataset.negatives is None:
                self._no_negatives(split)

    def _no_negatives(self, split: str) -> None:
        raise ConfigError(f"{self._negatives_for} needs the negatives of split {split}, but there is no "
                          f"{self.negatives_path(split)}: run scripts/prepare/sample_negatives.py (it writes "
                          "{split}.negatives.pt next to the data or into --residual-negatives-dir)")

    def load_negatives(self, split: str, num_blocks: int) -> Optional[torch.Tensor]:
        """The stored negatives of ``split`` (N, n, L), checked against the blocks, or
        None when the file does not exist."""
        path = self.negatives_path(split)
        if not os.path.isfile(path):
            return None
        stored = torch.load(path, weights_only=True)
        expect = {"prefix_len": self.cfg.residual_prefix_len, "continuation_len": self.cfg.residual_continuation_len,
                  "num_blocks": num_blocks}
        got = {"prefix_len": stored["prefix_len"], "continuation_len": stored["continuation_len"],
               "num_blocks": stored["tokens"].size(0)}
        if got != expect:
            raise ConfigError(f"residual_lm: negatives {path} were sampled for {got}, but this run has {expect}: "
                             f"rerun scripts/prepare/sample_negatives.py with the same --residual-prefix-len and "
                             f"--residual-continuation-len")
        topk = int(stored.get("topk", 0) or 0)
        if topk > 0 and not self.cfg.residual_allow_topk_negatives:
            raise ConfigError(f"residual_lm: negatives {path} were sampled with --topk {topk}: NCE then learns "
                             f"against a truncated base LM, not P_LM, so the joint model P_LM exp(-E) / Z and its "
                             f"log-Z estimates do not hold; resample with --topk 0, or pass "
                             f"--residual-allow-topk-negatives to train anyway")
        if topk > 0:
            logger.warning("residual_lm: negatives %s were sampled with top-k %d (--residual-allow-topk-negatives): "
                           "the energy is trained against the truncated LM; joint perplexities are not valid",
                           path, topk)
        if stored["tokens"].size(1) < self.cfg.residual_num_negatives:
            raise ConfigError(f"--residual-num-negatives {self.cfg.residual_num_negatives} > the "
                             f"{stored['tokens'].size(1)} negatives per prefix stored in {path}")
        return stored["tokens"]

    def load_dataset(self, split: str, epoch: int = 1, combine: bool = False, **kwargs):
        blocks = self.load_blocks(split)
        negatives = self.load_negatives(split, len(blocks))
        if negatives is None and self._negatives_for:
            self._no_negatives(split)
        self.datasets[split] = ResidualLMDataset(
            blocks, self.cfg.residual_prefix_len, negatives, self.cfg.residual_num_negatives,
            shuffle_negatives=split.startswith("train"), seed=self.cfg.seed,
        )

    def max_positions(self):
        return None

    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None, **kwargs):
        cfg = self.cfg
        return JointSampler(self.base_lm, cfg.residual_continuation_len, cfg.residual_joint_samples,
                            cfg.residual_joint_topk, num_outputs=getattr(args, "nbest", 1),
                            energy_batch_size=cfg.residual_energy_batch_size, seed=cfg.seed)

    def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None):
        with torch.no_grad():
            return generator.generate(models, sample)
