"""Model ``residual_energy``: the energy E_theta(x_1..x_T) of a residual EBM
(Deng et al., 2020, eq. 2) over the whole sequence, prefix and continuation.

E = w^T mean_t h_t + b, the mean over positions of the top hidden states h_t of
a transformer:
- ``--energy-variant unit``: the causal transformer of the base LM (``--residual-base-lm``
  of the task), initialised from its weights (all of them trainable; the base LM
  used for sampling stays frozen and separate). Input [<eos>, x_1..x_T]; the
  mean is over the T positions of x.
- ``--energy-variant bit``: a bidirectional transformer encoder trained from
  scratch (``--encoder-*`` sizes).

``forward(src_tokens)`` takes (N, T) sequences and returns (N,) energies.
Positions holding <pad> are left out of the mean.
"""
import copy
from dataclasses import dataclass, field

import torch
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models import BaseFairseqModel, register_model
from fairseq.models.transformer import TransformerConfig, TransformerEncoderBase
from torch import Tensor, nn

from fairseq_ext.core.constraints import at_least, between
from fairseq_ext.runtime.cli import ConfigError
from fairseq_ext.runtime.validation import check_options


@dataclass
class ResidualEnergyConfig(FairseqDataclass):
    energy_variant: ChoiceEnum(["unit", "bit"]) = field(
        default="bit",
        metadata={"help": "unit: causal transformer initialised from the base LM; bit: bidirectional encoder"},
    )
    encoder_layers: int = field(default=2, metadata={"help": "bit: transformer layers", "constraint": at_least(1)})
    encoder_embed_dim: int = field(default=64, metadata={"help": "bit: model dimension", "constraint": at_least(1)})
    encoder_ffn_embed_dim: int = field(default=128, metadata={"help": "bit: feed-forward dimension",
                                                              "constraint": at_least(1)})
    encoder_attention_heads: int = field(default=4, metadata={"help": "bit: attention heads",
                                                              "constraint": at_least(1)})
    dropout: float = field(default=0.1, metadata={"help": "bit: dropout", "constraint": between(0, 1)})
    max_positions: int = field(default=512, metadata={"help": "bit: maximum sequence length (learned positions)",
                                                      "constraint": at_least(1)})


def masked_mean(hidden: Tensor, keep: Tensor) -> Tensor:
    """hidden: (N, T, d), keep: (N, T) bool -> (N, d) mean over the kept positions."""
    keep = keep.to(hidden.dtype)[:, :, None]
    return (hidden * keep).sum(1) / keep.sum(1).clamp(min=1.0)


@register_model("residual_energy", dataclass=ResidualEnergyConfig)
class ResidualEnergyModel(BaseFairseqModel):
    def __init__(self, variant: str, body: nn.Module, dim: int, pad: int, eos: int):
        super().__init__()
        self.variant, self.body, self.pad, self.eos = variant, body, pad, eos
        self.proj = nn.Linear(dim, 1)

    @classmethod
    def build_model(cls, cfg: ResidualEnergyConfig, task):
        check_options(ResidualEnergyConfig, cfg)
        dictionary = task.source_dictionary
        if cfg.energy_variant == "unit":
            base = getattr(task, "base_lm", None)
            if base is None:
                raise ConfigError("--energy-variant unit is initialised from the task's --residual-base-lm "
                                  "(task residual_lm)")
            decoder = copy.deepcopy(base.decoder)
            decoder.requires_grad_(True)
            out = getattr(decoder, "output_projection", None)
            if out is not None and out.weight is not decoder.embed_tokens.weight:
                # the energy reads hidden states: an unused trainable tensor would stall c10d DDP
                out.requires_grad_(False)
            return cls("unit", decoder, decoder.output_embed_dim, dictionary.pad(), dictionary.eos())
        tcfg = TransformerConfig()
        tcfg.encoder.layers = cfg.encoder_layers
        tcfg.encoder.embed_dim = cfg.encoder_embed_dim
        tcfg.encoder.ffn_embed_dim = cfg.encoder_ffn_embed_dim
        tcfg.encoder.attention_heads = cfg.encoder_attention_heads
        tcfg.encoder.learned_pos = True
        tcfg.dropout = cfg.dropout
        tcfg.max_source_positions = cfg.max_positions
        embed = nn.Embedding(len(dictionary), cfg.encoder_embed_dim, padding_idx=dictionary.pad())
        nn.init.normal_(embed.weight, mean=0, std=cfg.encoder_embed_dim ** -0.5)
        nn.init.constant_(embed.weight[dictionary.pad()], 0)
        encoder = TransformerEncoderBase(tcfg, dictionary, embed)
        return cls("bit", encoder, cfg.encoder_embed_dim, dictionary.pad(), dictionary.eos())

    def forward(self, src_tokens: Tensor, **unused) -> Tensor:
        """src_tokens: (N, T) -> (N,) energies."""
        keep = src_tokens.ne(self.pad)
        if self.variant == "unit":
            bos = src_tokens.new_full((src_tokens.size(0), 1), self.eos)
            hidden = self.body.extract_features(torch.cat([bos, src_tokens], 1), None)[0][:, 1:]  # (N, T, d)
        else:
            lengths = keep.sum(1)
            hidden = self.body(src_tokens, lengths)["encoder_out"][0].transpose(0, 1)  # (N, T, d)
        return self.proj(masked_mean(hidden, keep)).squeeze(-1)

    def max_positions(self):
        return None
