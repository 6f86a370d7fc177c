"""Model ``tagging_lstm``: the seq2seq tagger with fixed attention of the Goyal
thesis (sections 3.3.3, 4.5, 5.4.2).

- Encoder: word embedding -> 1-layer BiLSTM (``--encoder-unidirectional``: left-to-right
  only, the label-bias ablation of section 5.4.2, Tables 5.2 / 5.3, where label i
  sees words 1..i only). Sources may come left- or right-padded; the encoder
  right-aligns them, so encoder state t is word t in every row.
- Decoder: 1-layer LSTM whose initial state is zero (section 5.4.2) and whose
  input at step t is [e(y_{t-1}); h^enc_t]: the previous label's embedding and
  the t-th encoder state (fixed attention: no attention parameters). Scores of
  step t are ``fc_out(h^dec_t)``.
- Forced length (default; ``--decoder-no-forced-length`` turns it off): the decoder
  masks its scores so that a sentence of n words gets exactly n labels and then
  ``<eos>`` (see ``fairseq_ext/core/tagger.py``), whatever the search.

It is a ``FairseqIncrementalDecoder``: fairseq's ``SequenceGenerator`` (greedy,
beam, sampling) and ``fairseq_ext.decoding.candidates.decode_candidates`` run on
it. The incremental state is ``{"hidden": (N, H), "cell": (N, H)}``, N = batch x
beam rows, reordered with ``index_select(0, new_order)``. Relaxed decoders drive
the recurrence directly with ``decoder.step`` on mixed label embeddings and
mixed states.

Archs: ``tagging_lstm`` = ``tagging_lstm_ner`` (hidden 64, label embedding 8,
section 4.5.1), ``tagging_lstm_pos`` (hidden and label embedding 512, the
section 4.5.2 sizes), ``tagging_lstm_tiny`` (tests). The thesis gives no word
embedding size: we use 100 (NER) and 512 (POS).
"""
from dataclasses import dataclass, field, fields
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
from fairseq import utils
from fairseq.dataclass import FairseqDataclass
from fairseq.models import (
    FairseqEncoder,
    FairseqEncoderDecoderModel,
    FairseqIncrementalDecoder,
    register_model,
    register_model_architecture,
)
from torch import Tensor
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from fairseq_ext.core.constraints import at_least, between
from fairseq_ext.core.tagger import fixed_attention, force_length
from fairseq_ext.runtime.validation import check_options

EncoderOut = Dict[str, list]
State = Dict[str, Optional[Tensor]]


@dataclass
class TaggingLSTMConfig(FairseqDataclass):
    encoder_embed_dim: int = field(default=100, metadata={"help": "word embedding size", "constraint": at_least(1)})
    encoder_hidden_size: int = field(
        default=64, metadata={"help": "encoder LSTM size per direction (thesis 4.5.1: 64 for NER)",
                              "constraint": at_least(1)}
    )
    encoder_unidirectional: bool = field(
        default=False,
        metadata={"help": "left-to-right encoder instead of a BiLSTM (label-bias ablation, thesis 5.4.2)",
                  "deprecated": "--unidirectional"},
    )
    decoder_embed_dim: int = field(default=8, metadata={"help": "label embedding size (thesis 4.5.1: 8 for NER)",
                                                        "constraint": at_least(1)})
    decoder_hidden_size: int = field(default=64, metadata={"help": "decoder LSTM size (thesis 4.5.1: 64 for NER)",
                                                           "constraint": at_least(1)})
    dropout: float = field(
        default=0.2, metadata={"help": "dropout on word embeddings, encoder states and decoder states",
                               "constraint": between(0, 1)}
    )
    decoder_no_forced_length: bool = field(
        default=False,
        metadata={"help": "do not mask the decoder scores to force exactly one label per word, then <eos>",
                  "deprecated": "--no-forced-length"},
    )


class TaggingLSTMEncoder(FairseqEncoder):
    """Word embedding -> 1-layer (Bi)LSTM; returns right-aligned states."""

    def __init__(self, dictionary, embed_dim: int, hidden_size: int, bidirectional: bool, dropout: float,
                 max_positions: int):
        super().__init__(dictionary)
        self.padding_idx = dictionary.pad()
        self.embed_tokens = nn.Embedding(len(dictionary), embed_dim, padding_idx=self.padding_idx)
        self.lstm = nn.LSTM(embed_dim, hidden_size, batch_first=True, bidirectional=bidirectional)
        self.dropout = nn.Dropout(dropout)
        self.output_dim = hidden_size * (2 if bidirectional else 1)
        self.max_source_positions = max_positions

    def forward(self, src_tokens: Tensor, src_lengths: Optional[Tensor] = None, **kwargs) -> EncoderOut:
        """src_tokens: (B, S), left- or right-padded. Returns ``encoder_out``:
        [(B, S, C)] states, right-aligned (state t = token t, zeros at padding), and
        ``encoder_padding_mask``: [(B, S)] bool, True at padding (right-aligned)."""
        tokens = utils.convert_padding_direction(src_tokens, self.padding_idx, left_to_right=True)
        padding_mask = tokens.eq(self.padding_idx)
        lengths = (~padding_mask).sum(dim=1)
        x = self.dropout(self.embed_tokens(tokens))
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        states, _ = self.lstm(packed)
        states, _ = pad_packed_sequence(states, batch_first=True, total_length=tokens.size(1))
        return {"encoder_out": [self.dropout(states)], "encoder_padding_mask": [padding_mask]}

    def reorder_encoder_out(self, encoder_out: EncoderOut, new_order: Tensor) -> EncoderOut:
        """Rows of every tensor in ``new_order`` (batch x beam expansion, dropped rows)."""
        return {key: [t.index_select(0, new_order) for t in value] for key, value in encoder_out.items()}

    def max_positions(self) -> int:
        return self.max_source_positions


class FixedAttentionLSTMDecoder(FairseqIncrementalDecoder):
    """LSTM over [e(y_{t-1}); h^enc_t] with zero initial state; see the module docstring."""

    def __init__(self, dictionary, encoder_dim: int, embed_dim: int, hidden_size: int, dropout: float,
                 forced_length: bool, max_positions: int):
        super().__init__(dictionary)
        self.embed_tokens = nn.Embedding(len(dictionary), embed_dim, padding_idx=dictionary.pad())
        self.lstm = nn.LSTM(embed_dim + encoder_dim, hidden_size, batch_first=True)
        self.dropout = nn.Dropout(dropout)
        self.fc_out = nn.Linear(hidden_size, len(dictionary))
        self.forced_length = forced_length
        self.max_target_positions = max_positions
        is_label = torch.zeros(len(dictionary), dtype=torch.bool)
        is_label[dictionary.nspecial :] = True
        self.register_buffer("is_label", is_label, persistent=False)

    @staticmethod
    def source_lengths(encoder_out: EncoderOut) -> Tensor:
        """(N,) source lengths n + 1 (words and ``<eos>``) of the encoder's rows."""
        return (~encoder_out["encoder_padding_mask"][0]).sum(dim=1)

    def step(self, prev_embed: Tensor, context: Tensor, state: Optional[State] = None) -> Tuple[Tensor, State]:
        """One or more recurrence steps on given inputs (no masking).

        prev_embed: (N, T, E) previous-label embeddings (one-hot rows of
            ``embed_tokens.weight`` or any mixture of them); context: (N, T, C)
            encoder states of those steps (``fixed_attention``); state: the
            previous ``{"hidden", "cell"}`` of shape (N, H) each, or None (zeros).
        Returns the scores (N, T, V) and the state after the last step.
        """
        x = torch.cat([prev_embed, context], dim=-1)
        if x.size(1) == 1:
            # one step (incremental decoding, the relaxed beam): the fused cell; nn.LSTM's
            # (mkldnn) layer costs ~1 ms more per call in the backward pass on CPU, which made
            # the search's T single-step calls dominate its training step
            zeros = x.new_zeros(x.size(0), self.lstm.hidden_size)
            h, c = torch.lstm_cell(x[:, 0], (zeros, zeros) if state is None else (state["hidden"], state["cell"]),
                                   self.lstm.weight_ih_l0, self.lstm.weight_hh_l0, self.lstm.bias_ih_l0,
                                   self.lstm.bias_hh_l0)
            return self.fc_out(self.dropout(h.unsqueeze(1))), {"hidden": h, "cell": c}
        hc = None if state is None else (state["hidden"].unsqueeze(0), state["cell"].unsqueeze(0))
        out, (h, c) = self.lstm(x, hc)
        return self.fc_out(self.dropout(out)), {"hidden": h.squeeze(0), "cell": c.squeeze(0)}

    def forward(
        self,
        prev_output_tokens: Tensor,
        encoder_out: Optional[EncoderOut] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        **kwargs,
    ) -> Tuple[Tensor, Dict]:
        """prev_output_tokens: (N, T) ``[<eos>, y_1, ...]`` (teacher forcing), or the
        whole prefix so far when ``incremental_state`` is given (then only the last
        token is fed and one step is computed). Returns scores (N, T', V), T' = T or
        1, with forced-length masking, and ``{"attn": [None]}``."""
        start = 0
        state = None
        if incremental_state is not None:
            start = prev_output_tokens.size(1) - 1
            prev_output_tokens = prev_output_tokens[:, -1:]
            state = self.get_incremental_state(incremental_state, "lstm_state")
        enc = encoder_out["encoder_out"][0]
        context = fixed_attention(enc, start, prev_output_tokens.size(1))
        logits, new_state = self.step(self.embed_tokens(prev_output_tokens), context, state)
        if incremental_state is not None:
            self.set_incremental_state(incremental_state, "lstm_state", new_state)
        if self.forced_length:
            logits = force_length(logits, start, self.source_lengths(encoder_out), self.is_label,
                                  self.dictionary.eos())
        return logits, {"attn": [None]}

    def reorder_incremental_state(
        self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]], new_order: Tensor
    ) -> None:
        state = self.get_incremental_state(incremental_state, "lstm_state")
        if state is None:
            return
        reordered = {k: (v.index_select(0, new_order) if v is not None else None) for k, v in state.items()}
        self.set_incremental_state(incremental_state, "lstm_state", reordered)

    def max_positions(self) -> int:
        return self.max_target_positions


@register_model("tagging_lstm", dataclass=TaggingLSTMConfig)
class TaggingLSTMModel(FairseqEncoderDecoderModel):
    """Seq2seq tagger with fixed attention; see the module docstring."""

    @classmethod
    def build_model(cls, cfg: TaggingLSTMConfig, task) -> "TaggingLSTMModel":
        check_options(TaggingLSTMConfig, cfg)
        max_source, max_target = task.max_positions()
        encoder = TaggingLSTMEncoder(
            task.source_dictionary, cfg.encoder_embed_dim, cfg.encoder_hidden_size, not cfg.encoder_unidirectional,
            cfg.dropout, max_source,
        )
        decoder = FixedAttentionLSTMDecoder(
            task.target_dictionary, encoder.output_dim, cfg.decoder_embed_dim, cfg.decoder_hidden_size,
            cfg.dropout, not cfg.decoder_no_forced_length, max_target,
        )
        return cls(encoder, decoder)


def _architecture(args, **sizes) -> None:
    """Fill every option not given on the command line: ``sizes``, else the
    ``TaggingLSTMConfig`` default."""
    for f in fields(TaggingLSTMConfig):
        if not f.name.startswith("_") and getattr(args, f.name, None) is None:
            setattr(args, f.name, sizes.get(f.name, f.default))


@register_model_architecture("tagging_lstm", "tagging_lstm_ner")
def tagging_lstm_ner(args) -> None:
    """Thesis 4.5.1 (NER): hidden 64, label embedding 8 (= the ``tagging_lstm`` defaults)."""
    _architecture(args)


@register_model_architecture("tagging_lstm", "tagging_lstm_pos")
def tagging_lstm_pos(args) -> None:
    """The thesis's 4.5.2 sizes (hidden and label embedding 512), used for POS."""
    _architecture(args, encoder_embed_dim=512, encoder_hidden_size=512, decoder_embed_dim=512,
                  decoder_hidden_size=512)


@register_model_architecture("tagging_lstm", "tagging_lstm_tiny")
def tagging_lstm_tiny(args) -> None:
    """For tests: 8 or 16 wide, no dropout."""
    _architecture(args, encoder_embed_dim=16, encoder_hidden_size=16, decoder_embed_dim=8,
                  decoder_hidden_size=16, dropout=0.0)
