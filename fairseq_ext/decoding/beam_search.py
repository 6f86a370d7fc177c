"""Relaxed (soft) beam search over a stock fairseq decoder (Goyal thesis,
Algorithm 3), and the hard beam search it tends to as alpha -> inf.

The decoder runs incrementally on B x k rows (sentence-major, beam-minor, as in
fairseq). At every step its scores feed ``core.beam_relaxation.soft_beam_step``; the next
input of element i is the soft output a_i^T E, and the decoder's whole incremental
state is mixed by the soft backpointers. fairseq's ``transformer`` decoder runs on the
differentiable static-cache step (``transformer_step.TransformerStep``: the soft input in
place of a token embedding, every layer's keys and values mixed by one batched
product); other decoders (``lstm``, ``tagging_lstm``) run fairseq's incremental path,
the soft input fed through the embedding hook of ``soft_inputs`` and the state mixed
by ``SoftReorder`` (``fairseq_step.FairseqStep``); ``steps.build_step`` builds the one or the
other, and one loop runs both. The two paths compute the same search (tested: scores, costs,
hypotheses and gradients, dropout masks included). ``hard=True`` runs the discrete beam instead
(exact top-k, index reorders, token inputs): the alpha -> inf limit, and a beam
search that ranks by raw scores when ``normalization="global"``.

Each sentence b is searched over a fixed horizon of ``horizon[b]`` steps (the gold
length, EOS included); past it, the sentence's elements are frozen (scores, costs
and states unchanged). Scores are log-softmax outputs (``local``) or the raw
logits (``global``, chapter 5).

With ``stop_at_eos`` (translation, where the output length is open) the horizon is
a length limit instead: an element whose (MAP) output is EOS is finished; from then
on its only candidate is padding at score 0, so it keeps its final score and
competes for its beam slot with the unfinished elements (a fixed-size beam, as in
Algorithms 1 and 3; fairseq's SequenceGenerator instead sets finished hypotheses
aside and keeps k open ones). A finished element pushed out of the beam by better
prefixes is not lost: the result is the k best hypotheses that ever ended (EOS)
in the beam, by score. An unfinished element never chooses a special symbol
other than EOS (padding, BOS, unk), nor EOS at the first step (fairseq's
``--min-len 1``), and at the last step of the horizon only EOS (fairseq forces EOS
at its length limit). The search stops early once every element is finished.
Nothing is length-normalised: hypotheses are ranked by their summed scores.
Training for translation runs under the same rules (``criterions/soft_beam.py``).

Dropout in train mode (``dropout``): ``independent`` leaves the model as it is
(each of the B x k decoder rows draws its own masks at every step);
``shared``: the k rows of one sentence share their masks (drawn per sentence and
step, expanded over the beam; the encoder runs once per sentence anyway);
``none``: the search runs in eval mode, every module's mode restored after.

Scores keep the model's precision (float64 for a float64 model; float16 / bfloat16
are computed in float32).
"""
import contextlib
import functools
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional

import torch
from fairseq.modules import FairseqDropout
from torch import Tensor

from fairseq_ext.core.beam_relaxation import hard_beam_step, soft_beam_step
from fairseq_ext.decoding.compiled_step import compiled as compiled_function
from fairseq_ext.decoding.soft_inputs import check_plain_output_layer, decoder_embedding
from fairseq_ext.decoding.steps import build_step

NORMALIZATIONS = ("local", "global")
DROPOUT_MODES = ("none", "shared", "independent")


@dataclass
class BeamResult:
    """scores: (B, k) final s_T (-inf: dead element); costs: (B, k) final D_T;
    tokens: (B, k, T) each element's output sequence, followed along the hard
    backpointers (pad past the sentence's horizon); best: (B,) index of the
    element with the highest final score."""

    scores: Tensor
    costs: Tensor
    tokens: Tensor
    best: Tensor

    def best_tokens(self) -> Tensor:
        """(B, T) the highest-scoring element's sequence."""
        return self.tokens[torch.arange(self.tokens.size(0)), self.best]


def local_scores(logits: Tensor, normalization: str) -> Tensor:
    """f(h, w): log-probabilities (``local``) or the raw logits (``global``), in
    the logits' precision (at least float32)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if normalization == "local":
        return torch.log_softmax(logits, dim=-1)
    if normalization == "global":
        return logits
    raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")


@contextlib.contextmanager
def _search_dropout(model, mode: str, sentences: int, beam: int) -> Iterator[Dict[str, int]]:
    """Dropout of the search pass (module docstring): ``none`` runs ``model`` in
    eval mode; ``shared`` makes every dropout module of the decoder draw one mask
    per sentence for the ``beam`` rows of each of the ``sentences``;
    ``independent`` changes nothing. Yields ``{"beam": beam, "sentences":
    sentences}``: the rows per sentence and the sentences that ``shared`` assumes,
    which the search updates as it goes (one row per sentence at its first step;
    fewer sentences once some have left the batch)."""
    rows = {"beam": beam, "sentences": sentences}
    if not model.training or mode == "independent" or (mode == "shared" and beam == 1):
        yield rows
    elif mode == "none":
        modes = [(m, m.training) for m in model.modules()]
        model.eval()
        # cuDNN computes an RNN's backward only in training mode: torch's RNN modules stay in it
        # with their own (between-layer) dropout set to 0, which makes their forward eval's
        rnns = [(m, m.dropout) for m in model.modules() if isinstance(m, torch.nn.RNNBase)]
        for m, _ in rnns:
            m.training, m.dropout = True, 0.0
        try:
            yield rows
        finally:
            for m, training in modes:
                m.training = training
            for m, p in rnns:
                m.dropout = p
    else:
        modules = [m for m in model.decoder.modules()
                   if isinstance(m, (torch.nn.Dropout, FairseqDropout)) and m.p > 0]
        for m in modules:
            m.forward = functools.partial(_shared_dropout, m, rows)
        try:
            yield rows
        finally:
            for m in modules:
                del m.forward  # the class's forward again


def _shared_dropout(module, layout: Dict[str, int], x: Tensor, *args, **kwargs) -> Tensor:
    """``module``'s dropout on ``x`` with one mask per sentence (``layout["sentences"]``
    sentences of ``layout["beam"]`` rows each, read at call time): the rows are the
    first dimension whose size is a multiple of sentences x beam (fairseq's lstm,
    transformer and tagging_lstm: (B*k, ...) or (1, B*k, ...) states, (B*k*heads,
    ...) attention weights; sentence-major, beam-minor, as in fairseq), viewed as
    (sentences, beam, rest); the mask is drawn for (sentences, 1, rest) and expanded
    over the beam."""
    sentences, beam = layout["sentences"], layout["beam"]
    rows = sentences * beam
    dims = [d for d, n in enumerate(x.shape) if n % rows == 0]
    if not module.training or not dims:
        return type(module).forward(module, x, *args, **kwargs)
    d = dims[0]
    shape = (*x.shape[:d], sentences, beam, x.size(d) // rows, *x.shape[d + 1:])
    mask_shape = (*x.shape[:d], sentences, 1, x.size(d) // rows, *x.shape[d + 1:])
    keep = torch.empty(mask_shape, dtype=x.dtype, device=x.device).bernoulli_(1.0 - module.p) / (1.0 - module.p)
    return (x.view(shape) * keep).view(x.shape)


def run_beam(
    model,
    net_input: Dict[str, Tensor],
    horizon: Tensor,
    beam: int,
    alpha: float = 1.0,
    normalization: str = "local",
    step_costs: Optional[Tensor] = None,
    augment: bool = False,
    hard: bool = False,
    stop_at_eos: bool = False,
    dropout: str = "independent",
    path: str = "static-cache",
    compiled: bool = False,
) -> BeamResult:
    """Soft (Algorithm 3) or hard (Algorithm 1) beam search for a batch.

    horizon: (B,) steps per sentence (with ``stop_at_eos``: the most steps, EOS
    included). step_costs: (B, T, V) d_t(w) (Hamming, see
    ``core.beam_relaxation.hamming_step_costs``), T = max horizon; accumulated into the
    costs, and added to the candidate scores when ``augment``. dropout:
    ``independent``, ``shared`` or ``none`` (module docstring). path: ``static-cache``,
    the static-cache step where it covers the decoder; ``fairseq``, fairseq's incremental
    path always (``steps.static_cache``).
    compiled: the static-cache step and the soft beam's step (``soft_beam_step``)
    compiled by ``torch.compile`` (``compiled_step``).
    """
    if dropout not in DROPOUT_MODES:
        raise ValueError(f"dropout must be one of {DROPOUT_MODES}, got {dropout!r}")
    with _search_dropout(model, dropout, net_input["src_tokens"].size(0), beam) as dropout_rows:
        return _run_beam(model, net_input, horizon, beam, alpha, normalization, step_costs, augment, hard,
                         stop_at_eos, dropout_rows, path, compiled)


def _run_beam(model, net_input: Dict[str, Tensor], horizon: Tensor, beam: int, alpha: float, normalization: str,
              step_costs: Optional[Tensor], augment: bool, hard: bool, stop_at_eos: bool,
              dropout_rows: Dict[str, int], path: str, compiled: bool = False) -> BeamResult:
    """The search. Step 0 runs the decoder once per sentence (K = 1: every beam
    element starts from the same empty prefix, and elements 1..k-1 are dead until
    the first step fills them) and the first reorder expands its state to k rows;
    later steps run k rows per live sentence.

    A sentence leaves the batch (its rows dropped from the decoder's state and the
    encoder output, as fairseq's SequenceGenerator drops finished sentences) once
    its result can no longer change: past its horizon (its elements are frozen),
    or with ``stop_at_eos`` once all of its elements are finished (they then only
    append padding, and the result holds only hypotheses that ended with EOS). The
    steps of the remaining sentences are unchanged, so this only saves work: the
    decoder runs sum_b k x (steps of b) rows instead of B x k x (longest horizon)."""
    decoder = model.decoder
    check_plain_output_layer(decoder)
    embedding = decoder_embedding(decoder)
    src = net_input["src_tokens"]
    B, k, device = src.size(0), beam, src.device
    dictionary = decoder.dictionary
    # one row per sentence at step 0, unless k exceeds the candidates of one row
    K = 1 if k <= len(dictionary) else k
    encoder_out = model.encoder(src, src_lengths=net_input.get("src_lengths"))
    eos, pad = dictionary.eos(), dictionary.pad()
    banned = torch.zeros(len(dictionary), dtype=torch.bool, device=device)  # special symbols but EOS
    banned[[dictionary.bos(), pad, dictionary.unk()]] = True
    length_rules = _LengthRules(banned, eos, pad)
    dtype = torch.promote_types(embedding.weight.dtype, torch.float32)
    horizon = horizon.to(device)
    T = int(horizon.max())
    # full-batch results (B, k): final scores and costs, and per step the hard backpointers
    # and outputs (a sentence that left: identity and padding), the ended scores and costs
    scores = torch.full((B, k), float("-inf"), device=device, dtype=dtype)
    scores[:, 0] = 0.0
    costs = torch.zeros(B, k, device=device, dtype=dtype)
    identity = torch.arange(k, device=device).expand(B, k)
    padding = torch.full_like(identity, pad)
    back_hist: List[Tensor] = []
    out_hist: List[Tensor] = []
    ended: List[Tensor] = []  # stop_at_eos: (B, k) score of each element that output EOS at step t, else -inf
    ended_costs: List[Tensor] = []
    # the live sentences (indices into the batch) and their state; n = len(live)
    live = torch.arange(B, device=device)
    live_scores, live_costs, live_horizon, live_step_costs = scores, costs, horizon, step_costs
    finished = torch.zeros(B, k, dtype=torch.bool, device=device)
    # the step (it holds the encoder's part of every row's state)
    step_fn = build_step(model, encoder_out, torch.arange(B, device=device).repeat_interleave(K), T, path,
                         "soft beam search", differentiable=True, compiled=compiled)
    relaxed_step = compiled_function(soft_beam_step, "the soft beam's step") if compiled else soft_beam_step
    inputs: Optional[Tensor] = None  # (n*k, E) soft inputs (the hard beam feeds tokens)
    # the tokens fed: the hard beam's outputs; the soft beam feeds EOS at every step (the soft input
    # replaces its embedding; the tokens still count for positions)
    tokens = torch.full((B * K,), eos, dtype=torch.long, device=device)
    eos_tokens: Dict[int, Tensor] = {}  # rows -> (rows,) EOS
    for t in range(T):
        n = live.numel()
        soft_input = t > 0 and not hard
        dropout_rows["beam"], dropout_rows["sentences"] = K, n
        if not hard and n * K not in eos_tokens:
            eos_tokens[n * K] = torch.full((n * K,), eos, dtype=torch.long, device=device)
        logits = step_fn.logits(tokens if hard else eos_tokens[n * K], inputs if soft_input else None)
        dropout_rows["beam"] = k
        f = local_scores(logits, normalization).view(n, K, -1)
        if stop_at_eos:
            f = length_rules(f, t, finished, live_horizon)
        d = None if live_step_costs is None else live_step_costs[:, t].to(dtype)
        # the search's arithmetic in float32 also under --amp (autocast would run its matrix
        # products in half precision and hand half-precision scores to the float32 buffers)
        with torch.autocast(device.type, enabled=False):
            if hard:
                step = hard_beam_step(live_scores[:, :K], f, k, live_costs[:, :K], d, augment)
            else:
                step = relaxed_step(live_scores[:, :K], f, alpha, k, live_costs[:, :K], d, augment)
        # every live sentence is within its horizon (t < horizon): the step applies to all
        live_scores, live_costs = step.scores, step.costs
        every = n == B  # no sentence has left: ``live`` is 0..B-1, the live results are the batch's
        if every:
            scores, costs = live_scores, live_costs
            back_hist.append(step.hard_backpointers)
            out_hist.append(step.hard_outputs)
        else:
            scores, costs = scores.index_copy(0, live, live_scores), costs.index_copy(0, live, live_costs)
            back_hist.append(identity.index_copy(0, live, step.hard_backpointers))
            out_hist.append(padding.index_copy(0, live, step.hard_outputs))
        done = t + 1 >= live_horizon  # (n,) the sentences whose result is final after this step
        if stop_at_eos:
            now = step.hard_outputs.eq(eos)
            ended_now = live_scores.masked_fill(~now, float("-inf"))
            ended.append(ended_now if every else torch.full_like(scores, float("-inf")).index_copy(
                0, live, ended_now))
            ended_costs.append(costs)
            finished = finished.gather(1, step.hard_backpointers) | now
            done = done | finished.all(1)
        leaving = int(done.sum())
        if leaving == n:
            break
        # the finished sentences leave the batch: each reorder below keeps only the rows
        # of the sentences in ``keep``, so their state is never reordered, mixed or decoded again
        keep = (~done).nonzero().squeeze(1) if leaving else (
            torch.arange(n, device=device) if hard or K < k else None)

        def kept(x: Tensor) -> Tensor:  # x's rows of the sentences in ``keep``
            return x[keep] if leaving else x
        if hard:
            order = (keep.view(-1, 1) * K + step.hard_backpointers[keep]).view(-1)
            step_fn.reorder(order)
            # finished elements (output pad) are fed EOS: their scores no longer change
            tokens = step.hard_outputs[keep].masked_fill(step.hard_outputs[keep].eq(pad), eos).view(-1)
        else:
            rows = None
            if K < k or leaving:
                rows = (keep.view(-1, 1) * K + torch.arange(K, device=device)).view(-1)  # their rows now
            if K < k:
                # from one row per sentence: the soft backpointers of a live element are
                # sum_w p_i(w) = 1 whatever the scores (no gradient), and a dead element's
                # state is never used, so the expansion is fairseq's hard reorder
                step_fn.reorder(rows.repeat_interleave(k))
            else:
                if leaving:
                    step_fn.reorder(rows)
                step_fn.mix(kept(step.backpointers).reshape(-1, k), n - leaving)
            with torch.autocast(device.type, enabled=False):
                outputs = kept(step.outputs)
                inputs = outputs.reshape(-1, outputs.size(-1)) @ embedding.weight.to(outputs.dtype)
        K = k
        if leaving:
            live, live_scores, live_costs = live[keep], live_scores[keep], live_costs[keep]
            live_horizon, finished = live_horizon[keep], finished[keep]
            if live_step_costs is not None:
                live_step_costs = live_step_costs[keep]
    if stop_at_eos:
        return _best_ended(ended, ended_costs, back_hist, out_hist, k, pad)
    best = scores.argmax(-1)
    return BeamResult(scores, costs, _follow_backpointers(back_hist, out_hist), best)


class _LengthRules:
    """Scores f (B, K, V) under the open-length rules of ``stop_at_eos`` (module
    docstring): a finished element's only candidate is pad at 0; unfinished ones never
    choose a ``banned`` (V',) symbol (pad, BOS, unk; its first V read), nor EOS at t = 0,
    and only EOS at their last step. What does not depend on the step is made once."""

    def __init__(self, banned: Tensor, eos: int, pad: int):
        self.banned, self.eos, self.pad = banned, eos, pad
        self.masks = None

    def __call__(self, f: Tensor, t: int, finished: Tensor, horizon: Tensor) -> Tensor:
        """f at step t; finished (B, k) (its first K read), horizon (B,)."""
        if self.masks is None:
            vocab = torch.arange(f.size(-1), device=f.device)
            is_eos = vocab.eq(self.eos)
            forbidden = self.banned[: f.size(-1)]
            # forbidden at t = 0, at later steps, at an element's last step; a finished element's scores
            self.masks = (forbidden | is_eos, forbidden, ~is_eos,
                          torch.zeros_like(vocab, dtype=f.dtype).masked_fill(vocab.ne(self.pad), float("-inf")))
        first, later, last, stay = self.masks
        forbidden = torch.where((horizon == t + 1).view(-1, 1, 1), last, first if t == 0 else later)  # (B, 1, V)
        return torch.where(finished[:, : f.size(1)].unsqueeze(-1), stay, f.masked_fill(forbidden, float("-inf")))


def _follow_backpointers(back_hist: List[Tensor], out_hist: List[Tensor], element: Optional[Tensor] = None,
                         end: Optional[Tensor] = None, pad: int = 1) -> Tensor:
    """(B, n, T) sequences traced back through the hard backpointers (Algorithm 1,
    line 11): of every final element (default), or of the elements ``element``
    (B, n) as they were at steps ``end`` (B, n), ``pad`` after their end."""
    B, k = back_hist[0].shape
    if element is None:
        element = torch.arange(k, device=back_hist[0].device).expand(B, k)
    tokens = []
    for t in range(len(back_hist) - 1, -1, -1):
        out = out_hist[t].gather(1, element)
        back = back_hist[t].gather(1, element)
        if end is not None:
            started = end >= t
            out = out.masked_fill(~started, pad)
            back = torch.where(started, back, element)
        tokens.append(out)
        element = back
    return torch.stack(tokens[::-1], dim=-1)


def _best_ended(ended: List[Tensor], ended_costs: List[Tensor], back_hist: List[Tensor], out_hist: List[Tensor],
                k: int, pad: int) -> BeamResult:
    """The k best hypotheses that ended (output EOS) at any step, by score
    (``stop_at_eos``); -inf scores where a sentence has fewer."""
    B = ended[0].size(0)
    flat = torch.stack(ended, dim=1).view(B, -1)  # (B, T*k), index t*k + i
    scores, index = flat.topk(min(k, flat.size(1)), dim=-1)
    end, element = index // k, index % k
    costs = torch.stack(ended_costs, dim=1).view(B, -1).gather(1, index)
    tokens = _follow_backpointers(back_hist, out_hist, element, end, pad)
    return BeamResult(scores, costs, tokens, scores.argmax(-1))
