"""Task ``translation_mh``: fairseq's ``translation_lev`` (train a ``cmlm_transformer``
with ``--noise random_mask`` exactly as there) whose generator is the
Metropolis-Hastings sampler of the thesis's chapter 6
(``fairseq_ext/generators/mh_sampler.py``, kernels in ``fairseq_ext/core/mcmc.py``).

    fairseq-generate DATA --user-dir "$(fairseq-ext-dir)" --task translation_mh --path cmlm.pt \\
        --mh-preset translate --mh-stats-file stats.jsonl

Options are documented in docs/mh_sampler.md.
"""
from dataclasses import dataclass, field
from typing import Optional

from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import register_task
from fairseq.tasks.translation_lev import TranslationLevenshteinConfig, TranslationLevenshteinTask
from omegaconf import II

from fairseq_ext.core import mcmc
from fairseq_ext.generators.mh_sampler import INITS, OUTPUTS, MHSampler
from fairseq_ext.runtime.validation import as_options, check_options
from fairseq_ext.tasks.batching import TaskBatching


# --mh-preset: option values over the defaults; "translate" passed Mask-Predict on two CMLMs
# (docs/mh_sampler.md, Recommended settings), "sample" keeps the exact sampler's defaults
PRESETS = {
    "sample": {},
    "translate": {"mh_energy": "raw", "mh_proposal_temperature": 0.8, "mh_accept_all_epochs": 2,
                  "mh_anneal_floor_at": 0.6, "mh_output": "best", "mh_chains": 5},
}


@dataclass
class TranslationMHConfig(TranslationLevenshteinConfig):
    mh_energy: ChoiceEnum(list(mcmc.ENERGIES)) = field(
        default="raw", metadata={"help": "target energy: raw = -sum of masked logits (section 6.2.1), "
                                         "local = -sum of masked log-probabilities (section 6.2.4)",
                                 "parameter": (mcmc.MHConfig, "energy")})
    mh_kernel: ChoiceEnum(list(mcmc.KERNELS)) = field(
        default="mh", metadata={"help": "mh = Metropolis-Hastings; gibbs = degenerate Gibbs (accept every "
                                        "proposal: the baseline of section 6.6, not a valid sampler)",
                                "parameter": (mcmc.MHConfig, "kernel")})
    mh_chains: int = field(default=1, metadata={"help": "Markov chains per sentence (one hypothesis each)",
                                                "parameter": (MHSampler, "chains")})
    mh_burn_in: int = field(default=7, metadata={"help": "burn-in epochs (section 6.5: 7)",
                                                 "parameter": (mcmc.MHConfig, "burn_in")})
    mh_epochs: int = field(default=26, metadata={"help": "epochs after burn-in (section 6.5: at least 26); "
                                                         "an epoch visits every position once",
                                                 "parameter": (mcmc.MHConfig, "epochs")})
    mh_order: ChoiceEnum(list(mcmc.ORDERS)) = field(
        default="random", metadata={"help": "position order within an epoch (random: without replacement)",
                                    "parameter": (mcmc.MHConfig, "order")})
    mh_block_size: int = field(default=1, metadata={"help": "positions masked and proposed together "
                                                            "(block MH, section 6.4.1)",
                                                    "parameter": (mcmc.MHConfig, "block_size")})
    mh_anneal_block: bool = field(default=False, metadata={"help": "anneal the block size linearly to 1 over "
                                                                   "the epochs (section 6.7.3)"})
    mh_proposal_temperature: float = field(default=1.0, metadata={"help": "temperature of the masked "
                                                                          "conditionals used as proposal",
                                                                  "parameter": (mcmc.MHConfig, "proposal_temperature")})
    mh_top_p: float = field(default=1.0, metadata={"help": "nucleus of the proposal (1.0: off)",
                                                   "parameter": (mcmc.MHConfig, "top_p")})
    mh_nucleus_mix: float = field(default=0.1, metadata={
        "help": "with --mh-top-p < 1, propose from (1 - eps) nucleus + eps full conditional, so the chain stays "
                "irreducible and converges to the target from any start (0: the thesis's pure nucleus, which "
                "samples the target only within the class of states reachable from the start)",
        "parameter": (mcmc.MHConfig, "nucleus_mix")})
    mh_target_temperature: float = field(default=1.0, metadata={"help": "sample from exp(-E / T)",
                                                                "parameter": (mcmc.MHConfig, "target_temperature")})
    mh_target_anneal: float = field(default=0.0, metadata={"help": "subtract this from the target temperature "
                                                                   "after every epoch (section 6.8: 0.02-0.06)",
                                                           "parameter": (mcmc.MHConfig, "target_anneal")})
    mh_anneal_floor_at: float = field(default=0.0, metadata={
        "help": "anneal the target temperature linearly to --mh-min-target-temperature, reaching it at this "
                "fraction of all epochs (burn-in included), then stay there (0: off; exclusive with "
                "--mh-target-anneal)",
        "parameter": (mcmc.MHConfig, "anneal_floor_at")})
    mh_min_target_temperature: float = field(default=0.05, metadata={
        "help": "floor of the annealed target temperature", "parameter": (mcmc.MHConfig, "min_target_temperature")})
    mh_accept_all_epochs: int = field(default=0, metadata={"help": "accept every proposal in the first N epochs "
                                                                   "(the Table 6.6 set-up uses 2)",
                                                           "parameter": (mcmc.MHConfig, "accept_all_epochs")})
    mh_output: ChoiceEnum(list(OUTPUTS)) = field(
        default="final", metadata={"help": "hypothesis printed per chain: final = the chain's last state (a "
                                           "sample), best = the lowest-energy state it visited (under annealing: "
                                           "its estimate of the mode), the chains printed lowest energy first",
                                   "parameter": (MHSampler, "output")})
    mh_init: ChoiceEnum(list(INITS)) = field(
        default="greedy", metadata={"help": "initial state: greedy = argmax of one pass over the all-masked "
                                            "target (Algorithm 4), random = uniform tokens",
                                    "parameter": (MHSampler, "init")})
    mh_max_rows: int = field(default=4096, metadata={"help": "decoder rows per forward pass (memory bound; "
                                                             "0: all single-masked copies at once)",
                                                     "parameter": (mcmc.MHConfig, "max_rows")})
    mh_preset: ChoiceEnum(list(PRESETS)) = field(
        default="sample", metadata={"help": "sample: the options' defaults, an exact sampler of exp(-E) (the "
                                            "thesis's); translate: one output per sentence for BLEU, the measured "
                                            "best (" + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in
                                                                  PRESETS["translate"].items())
                                            + "); an option given explicitly with another value than its "
                                              "default keeps that value"})
    mh_stats_file: Optional[str] = field(default=None, metadata={"help": "write per-sentence chain statistics "
                                                                        "(JSON lines) here"})
    mh_history: bool = field(default=False, metadata={"help": "also store every chain's state after each "
                                                               "epoch in --mh-stats-file"})
    seed: int = II("common.seed")
    num_shards: int = II("dataset.num_shards")  # fairseq-generate --num-shards (tasks/batching.py)
    shard_id: int = II("dataset.shard_id")


def apply_preset(cfg) -> None:
    """Set the options of ``cfg.mh_preset`` that still have their default value (in place)."""
    defaults = TranslationMHConfig()
    for name, value in PRESETS[str(getattr(cfg, "mh_preset", "sample"))].items():
        if str(getattr(cfg, name)) == str(getattr(defaults, name)):
            setattr(cfg, name, value)


@register_task("translation_mh", dataclass=TranslationMHConfig)
class TranslationMHTask(TaskBatching, TranslationLevenshteinTask):
    """``translation_lev`` with the Metropolis-Hastings sampler as generator."""

    cfg: TranslationMHConfig

    def __init__(self, cfg: TranslationMHConfig, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        apply_preset(cfg)
        check_options(TranslationMHConfig, cfg)
        with as_options(TranslationMHConfig):
            self.mh_config().check()

    def mh_config(self) -> mcmc.MHConfig:
        c = self.cfg
        return mcmc.MHConfig(
            energy=str(c.mh_energy), kernel=str(c.mh_kernel), burn_in=c.mh_burn_in, epochs=c.mh_epochs,
            order=str(c.mh_order), block_size=c.mh_block_size, anneal_block=c.mh_anneal_block,
            proposal_temperature=c.mh_proposal_temperature, top_p=c.mh_top_p, nucleus_mix=c.mh_nucleus_mix,
            target_temperature=c.mh_target_temperature, target_anneal=c.mh_target_anneal,
            anneal_floor_at=c.mh_anneal_floor_at,
            min_target_temperature=c.mh_min_target_temperature, accept_all_epochs=c.mh_accept_all_epochs,
            max_rows=c.mh_max_rows)

    def build_generator(self, models, args, **unused):
        return MHSampler(models, self.target_dictionary, self.mh_config(), chains=self.cfg.mh_chains,
                         init=str(self.cfg.mh_init), output=str(self.cfg.mh_output), stats_file=self.cfg.mh_stats_file,
                         history=self.cfg.mh_history, seed=self.cfg.seed)
