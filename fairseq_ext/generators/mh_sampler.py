"""fairseq adapter of the Metropolis-Hastings sampler (fairseq_ext/core/mcmc.py) for
conditional masked LMs (fairseq's ``cmlm_transformer``, Mask-Predict): the task
``translation_mh`` returns it from ``build_generator``, so ``fairseq-generate``
prints one hypothesis per chain (chain order) and, with ``--mh-stats-file``,
writes per-sentence chain statistics as JSON lines.

Target length: the model's length predictor (top-1), as fairseq's iterative
refinement does; the chains sample sequences of that length (section 6.5). BOS and
EOS stay in place; special symbols (and the dictionary's ``madeupword`` padding
entries) are never proposed.
"""
import json
import logging
from typing import Dict, List, Optional, Sequence

import torch
from torch import Tensor

from fairseq_ext.runtime.cli import ConfigError
from fairseq_ext.core import mcmc
from fairseq_ext.core.constraints import OneOf, at_least, check_arguments, declare
from fairseq_ext.core.sampling import batch_generator

logger = logging.getLogger(__name__)

INITS = ("greedy", "random")
OUTPUTS = ("final", "best")


def check_cmlm(model) -> None:
    """The sampler needs a conditional masked LM with a length predictor."""
    decoder = getattr(model, "decoder", None)
    if not (hasattr(model, "initialize_output_tokens") and hasattr(decoder, "extract_features")
            and hasattr(decoder, "output_layer")):
        raise ConfigError(
            f"translation_mh: the model ({type(model).__name__}) is not a conditional masked LM; "
            "--path must point to a cmlm_transformer checkpoint (trained with --task translation_lev "
            "--noise random_mask, or --task translation_mh)")
    if getattr(decoder, "src_embedding_copy", False):
        raise ConfigError("translation_mh: models trained with --src-embedding-copy are not supported")


def cmlm_logits_fn(model, encoder_out) -> mcmc.LogitsFn:
    """The masked-LM callback of core/mcmc.py for a CMLM: rows are decoded against
    the encoder output of their ``owner`` sentence; only the asked-for positions go
    through the output projection (rows x positions x V, not rows x L x V)."""
    def logits_fn(tokens: Tensor, owner: Tensor, positions: Tensor) -> Tensor:
        enc = model.encoder.reorder_encoder_out(encoder_out, owner)
        features, _ = model.decoder.extract_features(tokens, encoder_out=enc)
        picked = features.gather(1, positions[..., None].expand(-1, -1, features.size(-1)))
        return model.decoder.output_layer(picked)
    return logits_fn


def forbidden_symbols(tgt_dict, device=None, size: Optional[int] = None) -> Tensor:
    """(V,) bool: BOS, padding, EOS, the mask (unk) and ``madeupword`` padding entries
    among the first ``size`` (default: all) entries of the dictionary."""
    size = len(tgt_dict) if size is None else size
    out = torch.zeros(size, dtype=torch.bool, device=device)
    out[: tgt_dict.nspecial] = True
    for i in range(tgt_dict.nspecial, size):
        if tgt_dict[i].startswith("madeupword"):
            out[i] = True
    return out


@declare(chains=at_least(1), init=OneOf(INITS), output=OneOf(OUTPUTS))
class MHSampler:
    """``generate(models, sample)`` for fairseq-generate: ``chains`` Markov chains per
    sentence, all sentences and chains of a batch advanced together."""

    def __init__(self, models: Sequence, tgt_dict, cfg: mcmc.MHConfig, chains: int = 1, init: str = "greedy",
                 stats_file: Optional[str] = None, history: bool = False, seed: int = 1, output: str = "final"):
        if len(models) != 1:
            raise ConfigError("translation_mh: ensembles are not supported; give one checkpoint in --path")
        check_cmlm(models[0])
        check_arguments(MHSampler, chains=chains, init=init, output=output)
        self.cfg = cfg.check()
        if cfg.top_p < 1 and cfg.nucleus_mix == 0:
            logger.warning("translation_mh: --mh-top-p %g with --mh-nucleus-mix 0: the chain may be reducible and then "
                           "samples the target only among the states reachable from its start (docs/mh_sampler.md)",
                           cfg.top_p)
        self.output = output
        self.tgt_dict = tgt_dict
        # the model's output vocabulary: fairseq-generate with --post-process / --remove-bpe adds the
        # detokenized words of every printed hypothesis to tgt_dict (encode_line(add_if_not_exist=True))
        self.vocab_size = len(tgt_dict)
        self.chains = chains
        self.init = init
        self.stats_file = stats_file
        self.history = history
        self.seed = seed
        self.bos, self.eos, self.pad, self.mask = tgt_dict.bos(), tgt_dict.eos(), tgt_dict.pad(), tgt_dict.unk()
        self.symbols_to_strip_from_output = {self.bos, self.eos}
        if stats_file:
            open(stats_file, "w").close()

    def initial_states(self, model, encoder_out, src_tokens, forbidden: Tensor,
                       generator: Optional[torch.Generator] = None):
        """(B*K, L) states with BOS, EOS and padding fixed, the ``free`` mask, owners."""
        tokens = model.initialize_output_tokens(encoder_out, src_tokens).output_tokens
        owner = torch.arange(tokens.size(0), device=tokens.device).repeat_interleave(self.chains)
        tokens = tokens[owner]
        free = tokens.eq(self.mask)
        if self.init == "greedy":  # Algorithm 4 line 3: one pass over the all-masked sequence
            logits_fn = cmlm_logits_fn(model, encoder_out)
            L = tokens.size(1)
            positions = torch.arange(L, device=tokens.device).expand(tokens.size(0), L)
            logits = mcmc.masked_logits(logits_fn, tokens, owner, positions, self.cfg.max_rows)
            logits = logits.float().masked_fill(forbidden, float("-inf"))
            tokens = torch.where(free, logits.argmax(-1), tokens)
        else:
            allowed = (~forbidden).nonzero(as_tuple=True)[0]
            draw = allowed[torch.randint(len(allowed), tokens.shape, device=tokens.device, generator=generator)]
            tokens = torch.where(free, draw, tokens)
        return tokens, free, owner

    @torch.no_grad()
    def generate(self, models, sample: Dict, **unused) -> List[List[Dict]]:
        model = models[0]
        model.eval()
        src_tokens = sample["net_input"]["src_tokens"]
        encoder_out = model.forward_encoder([src_tokens, sample["net_input"]["src_lengths"]])
        forbidden = forbidden_symbols(self.tgt_dict, src_tokens.device, self.vocab_size)
        gen = batch_generator(self.seed, sample["id"])  # the same draws in any shard (--num-shards)
        tokens, free, owner = self.initial_states(model, encoder_out, src_tokens, forbidden, gen)
        logits_fn = cmlm_logits_fn(model, encoder_out)
        result = mcmc.run_chains(logits_fn, tokens, free, owner, self.mask, self.cfg, forbidden=forbidden,
                                 generator=gen, keep_history=self.history)
        if self.output == "best":
            printed, energy = result.best_tokens, result.best_energy
        else:
            printed, energy = result.tokens, (result.e_raw if self.cfg.energy == "raw" else result.e_local)
        _, local_terms = mcmc.energy_terms(logits_fn, printed, free, owner, self.mask, self.cfg.max_rows)
        hypos = []
        for b in range(src_tokens.size(0)):
            rows = range(b * self.chains, (b + 1) * self.chains)
            if self.output == "best":  # the best of the chains first: what --nbest 1 prints
                rows = sorted(rows, key=lambda r: float(energy[r]))
            hypos.append([self.hypothesis(printed[r], local_terms[r], energy[r]) for r in rows])
        if self.stats_file:
            self.write_stats(sample, result)
        return hypos

    def hypothesis(self, tokens: Tensor, local_terms: Tensor, energy: Tensor) -> Dict:
        """fairseq's hypothesis dict: tokens without BOS, ending in EOS; positional
        scores log p_mlm(y_t | y without t); score -E / length (the chosen energy)."""
        keep = tokens.ne(self.pad)
        keep[0] = False
        out = tokens[keep]
        return {"tokens": out, "score": -energy / max(1, out.numel()), "positional_scores": -local_terms[keep],
                "alignment": torch.empty(0), "attention": None, "steps": self.cfg.total_epochs}

    def write_stats(self, sample: Dict, result: mcmc.ChainResult) -> None:
        """One JSON line per sentence: per-epoch proposal / acceptance / novel counts,
        energies and lowest energy so far per chain, each chain's lowest-energy state
        and its energy, and each chain's state (token pieces) when
        ``--mh-history`` is set."""
        st = result.stats
        with open(self.stats_file, "a") as f:
            for b, sid in enumerate(sample["id"].tolist()):
                r = slice(b * self.chains, (b + 1) * self.chains)
                target = sample["target"][b] if sample.get("target") is not None else None
                ref = "" if target is None else self.tgt_dict.string(target[target.ne(self.pad)])
                line = {"id": sid, "ref": ref,
                        "length": int(result.tokens[r.start].ne(self.pad).sum()) - 2,
                        "burn_in": self.cfg.burn_in, "energy": self.cfg.energy, "kernel": self.cfg.kernel,
                        "best_energy": result.best_energy[r].tolist(),
                        "best_hyps": [self.tgt_dict.string(h[h.ne(self.pad)]) for h in result.best_tokens[r]],
                        "epochs": []}
                for e in range(len(st.proposals)):
                    row = {"epoch": e, "target_temperature": st.target_temperature[e], "block_size": st.block_size[e],
                           "proposals": st.proposals[e][r].tolist(), "accepted": st.accepted[e][r].tolist(),
                           "novel": st.novel[e][r].tolist(), "e_raw": st.e_raw[e][r].tolist(),
                           "e_local": st.e_local[e][r].tolist(), "e_best": st.e_best[e][r].tolist()}
                    if result.history:
                        row["hyps"] = [self.tgt_dict.string(h[h.ne(self.pad)]) for h in result.history[e][r]]
                    line["epochs"].append(row)
                f.write(json.dumps(line) + "\n")
