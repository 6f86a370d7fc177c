"""Teacher-forced scoring of given hypotheses under a fairseq model: log p(y | x) of
every row in one forward, differentiable (MRT's and PG's candidates and references, the
``lm`` cost's continuations)."""
from typing import Dict, List, Optional, Tuple

import torch
from fairseq.data import data_utils
from torch import Tensor


def _left_aligned(tokens: Tensor, pad: int) -> Tensor:
    """(N, W) tokens with every row's non-pad tokens moved to its start, in order, pads after
    (a right-padded batch comes back unchanged; a left-padded one is right-padded)."""
    order = torch.sort(tokens.eq(pad).to(torch.uint8), dim=1, stable=True)[1]
    return tokens.gather(1, order)


def pad_columns(tokens: Tensor, width: int, pad: int) -> Tensor:
    """(N, W) tokens widened to (N, width >= W) with ``pad`` columns on the right."""
    return torch.nn.functional.pad(tokens, (0, width - tokens.size(1)), value=pad)


def _padded(hyps, pad: int, device) -> Tensor:
    """Hypotheses as one right-padded (N, W >= 1) LongTensor: a list of 1-D tensors, or
    already a tensor (any padding)."""
    if isinstance(hyps, Tensor):
        tokens = _left_aligned(hyps.to(device), pad)
    else:  # collate_tokens pads on the right already
        tokens = (data_utils.collate_tokens(hyps, pad) if len(hyps) else torch.zeros(0, 0, dtype=torch.long)).to(device)
    return tokens if tokens.size(1) > 0 else tokens.new_full((tokens.size(0), 1), pad)


def source_batch(sources: List[Tensor], pad: int, eos: int, left_pad: bool = True) -> Tuple[Dict, Tensor]:
    """(a batch of the distinct ``sources`` (1-D id tensors), the row of each source in it): what
    ``token_log_probs`` reads as ``sample`` and ``source_index``. Each distinct source is encoded
    once, the longest first (fairseq's LSTM encoder packs its batch and needs the lengths in
    decreasing order, as fairseq's batches have them)."""
    distinct: Dict[tuple, Tensor] = {}
    for x in sources:
        distinct.setdefault(tuple(x.tolist()), x)
    order = sorted(distinct, key=len, reverse=True)
    row = {key: i for i, key in enumerate(order)}
    unique = [distinct[key] for key in order]
    device = sources[0].device if sources else torch.device("cpu")
    sample = {"net_input": {"src_tokens": data_utils.collate_tokens(unique, pad, eos, left_pad=left_pad),
                            "src_lengths": torch.tensor([len(x) for x in unique], device=device)}}
    return sample, torch.tensor([row[tuple(x.tolist())] for x in sources], device=device)


def sequence_log_probs(
    model, sample: Dict, hyps, source_index: Tensor, prefix_tokens: Optional[Tensor] = None
) -> Tensor:
    """Teacher-forced log p(y | x) = sum_t log p(y_t | y_<t, x) of every hypothesis (N,),
    differentiable (call under no_grad for a frozen scorer); ``token_log_probs`` summed."""
    return token_log_probs(model, sample, hyps, source_index, prefix_tokens).sum(dim=1)


def token_log_probs(
    model, sample: Dict, hyps, source_index: Tensor, prefix_tokens: Optional[Tensor] = None
) -> Tensor:
    """Teacher-forced log p(y_t | y_<t, x) of every token of every hypothesis, (N, W), 0
    after a hypothesis's end (W: the longest hypothesis, or a hypothesis's own columns
    for a decoder-only model's prompt), differentiable.

    model: encoder-decoder (the source is ``sample['net_input']``, encoded once and
        expanded to the hypotheses with ``source_index``) or decoder-only (the
        hypotheses continue ``prefix_tokens[source_index]``, padded with ``<pad>``).
    hyps: N 1-D LongTensors (EOS included where produced), or one (N, W) LongTensor of
        them padded with ``<pad>`` (``decoding.candidates.Candidates.tokens``, a batch's ``target``): one
        forward for all rows, built without a loop over them. Returns (N, W): for a decoder-only
        model, column c of a row is its hypothesis's token c - |prefix| (zeros elsewhere).
    """
    dictionary = model.decoder.dictionary
    pad, eos = dictionary.pad(), dictionary.eos()
    device = sample["net_input"]["src_tokens"].device
    hyp = _padded(hyps, pad, device)  # (N, H)
    n = hyp.size(0)
    hyp_len = hyp.ne(pad).sum(dim=1)
    if getattr(model, "encoder", None) is not None:  # encoder-decoder
        target = hyp
        prev = torch.cat([hyp.new_full((n, 1), eos), hyp[:, :-1].masked_fill(hyp[:, 1:].eq(pad), pad)], dim=1)
        encoder_out = model.encoder.forward_torchscript(sample["net_input"])
        encoder_out = model.encoder.reorder_encoder_out(encoder_out, source_index.to(device))
        net_output = model.decoder(prev, encoder_out=encoder_out)
    else:
        if prefix_tokens is None:
            raise ValueError("a decoder-only model needs the prefixes the hypotheses continue")
        prefix = _left_aligned(prefix_tokens.index_select(0, source_index.to(prefix_tokens.device)).to(device), pad)
        if prefix.size(1) == 0:
            prefix = prefix.new_full((n, 1), pad)
        prefix_len = prefix.ne(pad).sum(dim=1, keepdim=True)
        hyp_len = hyp_len[:, None]
        # column c of the decoder input: <s> (the EOS symbol, as fairseq), then the prefix, then
        # the hypothesis but its last token; column c predicts hypothesis token c - |prefix|
        total = int((prefix_len + hyp_len.clamp(min=1)).max()) if n else 1
        col = torch.arange(total, device=device)[None]
        from_prefix = prefix.gather(1, (col - 1).clamp(0, prefix.size(1) - 1).expand(n, -1))
        hyp_at = (col - prefix_len).clamp(0, hyp.size(1) - 1)
        in_hyp = (col >= prefix_len) & (col < prefix_len + hyp_len)
        target = hyp.gather(1, hyp_at).masked_fill(~in_hyp, pad)
        prev = torch.where(col <= prefix_len, from_prefix, hyp.gather(1, (hyp_at - 1).clamp(min=0)))
        prev = prev.masked_fill((col >= prefix_len + hyp_len) & (col > prefix_len), pad)
        prev[:, 0] = eos
        net_output = model.decoder(prev)
    lprobs = model.get_normalized_probs(net_output, log_probs=True)
    mask = target.ne(pad)
    return lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1) * mask
