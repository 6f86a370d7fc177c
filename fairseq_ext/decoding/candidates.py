"""Batched candidate decoding for fairseq models: the shared decoder that MGS, MRT,
PG and evaluation call.

Greedy decoding and ancestral sampling (temperature, top-k, top-p) run one loop over a
step object (``steps.build_step``): the static-cache step for a fairseq ``transformer`` /
``transformer_lm`` / ``lstm`` / ``lstm_lm``, one step of few operators for all B x n rows;
fairseq's incremental decoding (``fairseq_step.FairseqStep``, the reference) for other
decoders and for every model with ``DecodeConfig.path = "fairseq"`` (``--decoding-path
fairseq``). Finished rows are masked, and dropped from every cache together once at most
half of the rows still run; both paths draw the same random numbers for the same rows. Beam
search delegates to fairseq's ``SequenceGenerator``. All return the same ``Candidates``.
Encoder-decoder models decode from the source, decoder-only ones continue a prefix.
Dropout is off while decoding; the model's train/eval mode is restored afterwards.
"""
import contextlib
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from fairseq_ext.core.constraints import CONSTRAINT, OneOf, ParameterError, above, at_least, check_fields, constraint_of
from fairseq_ext.core.sampling import choose_tokens, filter_logits
from fairseq_ext.decoding.steps import PATHS, build_step, unsupported_reason

STRATEGIES = ("greedy", "sample", "beam")


@dataclass
class DecodeConfig:
    """How to decode candidates.

    strategy: ``greedy``, ``sample`` or ``beam``.
    num_candidates: candidates per input (samples for ``sample``, the n best for
        ``beam``; must be 1 for ``greedy``).
    beam_size: beam width for ``beam`` (defaults to num_candidates).
    temperature, topk, topp, epsilon: sampling distribution (``sample`` only;
        ``core.sampling.filter_logits``: epsilon None is off).
    min_len: EOS is banned until this many tokens were generated (1, as
        fairseq-generate: no empty candidates; 0 allows them).
    max_len_a, max_len_b: maximum length a * src_len + b (as fairseq-generate).
    max_len_ref_ratio: if set, the maximum length is instead ceil(ratio * the
        longest reference in the batch) (MGS uses 1.3).
    path: ``static-cache``, greedy and sampling with the static-cache step where it covers
        the decoder; ``fairseq``, fairseq's incremental decoding for every model
        (``steps.static_cache``).
    """

    strategy: str = field(default="greedy", metadata={CONSTRAINT: OneOf(STRATEGIES)})
    num_candidates: int = field(default=1, metadata={CONSTRAINT: at_least(1)})
    beam_size: Optional[int] = field(default=None, metadata={CONSTRAINT: at_least(1)})
    temperature: float = field(default=1.0, metadata={CONSTRAINT: constraint_of(choose_tokens, "temperature")})
    topk: int = field(default=0, metadata={CONSTRAINT: constraint_of(filter_logits, "topk")})
    topp: float = field(default=1.0, metadata={CONSTRAINT: constraint_of(filter_logits, "topp")})
    epsilon: Optional[float] = field(default=None, metadata={CONSTRAINT: constraint_of(filter_logits, "epsilon")})
    min_len: int = field(default=1, metadata={CONSTRAINT: at_least(0)})
    max_len_a: float = 0.0
    max_len_b: int = 200
    max_len_ref_ratio: Optional[float] = field(default=None, metadata={CONSTRAINT: above(0)})
    path: str = field(default="static-cache", metadata={CONSTRAINT: OneOf(PATHS)})

    def __post_init__(self) -> None:
        check_fields(self)  # ParameterError naming the field
        if self.strategy == "greedy" and self.num_candidates != 1:
            raise ParameterError(DecodeConfig, "num_candidates", "must be 1 for greedy decoding (one candidate per "
                                 f"input), got {self.num_candidates!r}")

    def greedy(self) -> "DecodeConfig":
        """Greedy decoding with this configuration's length limits and path (what the
        criteria log as the deployed decoder's output, and PG's greedy baseline)."""
        return DecodeConfig(min_len=self.min_len, max_len_a=self.max_len_a, max_len_b=self.max_len_b,
                            max_len_ref_ratio=self.max_len_ref_ratio, path=self.path)


@dataclass
class Candidates:
    """Decoded candidates for a batch of B inputs, n per input, rows grouped by input.

    tokens: (B*n, T) LongTensor, right-padded with ``pad``; EOS included where it
        was produced; neither the BOS nor a forced prefix is included.
    lengths: (B*n,) number of tokens in each row (EOS included).
    scores: (B*n,) sum of log p(y_t | y_<t, x) under the model (temperature 1,
        no truncation) of the decoded tokens.
    finished: (B*n,) True where EOS was produced within the length limit.
    num_per_input: n.
    """

    tokens: Tensor
    lengths: Tensor
    scores: Tensor
    finished: Tensor
    num_per_input: int

    @property
    def source_index(self) -> Tensor:
        """(B*n,) index of the input each row belongs to."""
        b = self.tokens.size(0) // self.num_per_input
        return torch.arange(b, device=self.tokens.device).repeat_interleave(self.num_per_input)

    def as_list(self) -> List[Tensor]:
        """One 1-D LongTensor per row, without padding."""
        return [row[:n] for row, n in zip(self.tokens, self.lengths.tolist())]

    def part(self, rows: slice, num_per_input: int) -> "Candidates":
        """The candidates of some rows, as their own ``Candidates`` (padding trimmed)."""
        lengths = self.lengths[rows]
        width = max(int(lengths.max().item()), 1) if lengths.numel() else 1
        return Candidates(self.tokens[rows, :width], lengths, self.scores[rows], self.finished[rows], num_per_input)


def prefix_sample(sample: Dict, pad: int, eos: int) -> Dict:
    """The batch as the decoder sees it at generation time: ``src_tokens`` =
    [eos, prefix], ``target`` = the reference continuation (right-padded)."""
    prefix = sample["prefix"]
    bsz = prefix.size(0)
    src = torch.cat([prefix.new_full((bsz, 1), eos), prefix], dim=1)
    k = prefix.size(1)
    continuation = sample["target"][:, k:]
    return {
        **sample,
        "net_input": {"src_tokens": src, "src_lengths": src.new_full((bsz,), src.size(1))},
        "target": continuation,
        "ntokens": int(continuation.ne(pad).sum()),
    }


def _is_encoder_decoder(model) -> bool:
    return getattr(model, "encoder", None) is not None


def max_decode_length(model, sample: Dict, cfg: DecodeConfig) -> int:
    """Maximum number of generated tokens (EOS included) for this batch."""
    net_input = sample["net_input"]
    if cfg.max_len_ref_ratio is not None:
        target = sample.get("target")
        if target is None:
            raise ValueError("max_len_ref_ratio needs references (sample['target'])")
        pad_mask = target.ne(_pad_of(model, sample))
        longest = int(pad_mask.sum(dim=1).max().item())
        max_len = int(math.ceil(cfg.max_len_ref_ratio * longest))
    else:
        src_len = int(net_input["src_tokens"].size(1))
        max_len = int(cfg.max_len_a * src_len + cfg.max_len_b)
    limit = model.max_decoder_positions() - 1 if hasattr(model, "max_decoder_positions") else None
    if limit is not None and limit > 0:
        max_len = min(max_len, limit)
    return max(max_len, 1)


def _pad_of(model, sample: Dict) -> int:
    return getattr(getattr(model, "decoder", model).dictionary, "pad", lambda: 1)()


@torch.no_grad()
def decode_candidates(
    model,
    sample: Dict,
    cfg: DecodeConfig,
    prefix_tokens: Optional[Tensor] = None,
    generator: Optional[torch.Generator] = None,
) -> Candidates:
    """Decode ``cfg.num_candidates`` candidates for every input in ``sample``.

    model: a fairseq encoder-decoder model or a decoder-only language model.
    sample: a fairseq batch (``net_input`` with ``src_tokens``/``src_lengths``;
        ``target`` when ``max_len_ref_ratio`` is used).
    prefix_tokens: (B, P) tokens forced at the first P steps (right-padded with
        pad; pad means "free"); required for decoder-only models, for which it is
        the prompt. Forced tokens are not part of the returned candidates.
    """
    with _eval_mode(model):
        if cfg.strategy == "beam":
            return _beam(model, sample, cfg, prefix_tokens)
        return _greedy_or_sample(model, sample, cfg, prefix_tokens, generator)


@contextlib.contextmanager
def _eval_mode(model) -> Iterator[None]:
    """Dropout off while decoding; the model's train / eval mode restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@dataclass
class ParameterSets:
    """G sets of values for one model's parameters, decoded together (MGS: theta and its K
    perturbations): ``stack(p)`` is the (G, *p.shape) stack of parameter p's values."""

    count: int
    stack: Callable[[Tensor], Tensor]


def grouped_reason(model, cfg: DecodeConfig) -> Optional[str]:
    """Why ``decode_grouped`` cannot decode ``model`` with ``cfg``, or None when it can."""
    if cfg.strategy == "beam":
        return "beam decoding (parameter sets are decoded together greedily or by sampling)"
    if cfg.path != "static-cache":
        return f"the {cfg.path} decoding path"
    return unsupported_reason(model.decoder)


@torch.no_grad()
def decode_grouped(model, sample: Dict, cfg: DecodeConfig, sets: ParameterSets,
                   prefix_tokens: Optional[Tensor] = None,
                   generators: Optional[Sequence[torch.Generator]] = None) -> List[Candidates]:
    """``decode_candidates`` once per parameter set of ``sets``, in one decode: the G sets'
    encoders run one after another, their decoders step together (``TransformerStep`` with
    grouped weights). Greedy decoding or sampling of the models the static-cache step
    covers (``grouped_reason``); sampling draws set g's tokens from ``generators[g]`` as
    ``decode_candidates`` would alone. Returns G ``Candidates``, set g's as
    ``decode_candidates`` of the model holding set g's values."""
    reason = grouped_reason(model, cfg)
    if reason is not None:
        raise ValueError(f"decode_grouped: {reason}")
    if cfg.strategy == "sample" and (generators is None or len(generators) != sets.count):
        raise ValueError(f"decode_grouped: sampling needs one generator per parameter set ({sets.count})")
    with _eval_mode(model):
        both = _greedy_or_sample(model, sample, cfg, prefix_tokens, generators, sets=sets)
    rows = both.tokens.size(0) // sets.count
    return [both.part(slice(g * rows, (g + 1) * rows), cfg.num_candidates) for g in range(sets.count)]


@torch.no_grad()
def decode_with_greedy(
    model,
    sample: Dict,
    cfg: DecodeConfig,
    prefix_tokens: Optional[Tensor] = None,
    generator: Optional[torch.Generator] = None,
) -> Tuple[Candidates, Candidates]:
    """(the ``cfg`` candidates, one greedy candidate per input), as ``decode_candidates``
    twice (``cfg`` and greedy with its length limits), in one decode when ``cfg`` samples:
    the greedy rows follow the sampled ones, which draw the random numbers they draw alone."""
    if cfg.strategy != "sample":
        return (decode_candidates(model, sample, cfg, prefix_tokens, generator),
                decode_candidates(model, sample, cfg.greedy(), prefix_tokens))
    with _eval_mode(model):
        both = _greedy_or_sample(model, sample, cfg, prefix_tokens, generator, greedy_rows=True)
    rows = both.tokens.size(0) - sample["net_input"]["src_tokens"].size(0)
    return both.part(slice(0, rows), cfg.num_candidates), both.part(slice(rows, None), 1)


def _greedy_or_sample(model, sample, cfg, prefix_tokens, generator, greedy_rows=False,
                      sets: Optional[ParameterSets] = None) -> Candidates:
    """Greedy decoding or ancestral sampling of B x n rows with the step ``steps.build_step``
    chooses (the static-cache step, or fairseq's incremental decoding): a row that finished is
    fed EOS and its outputs are ignored; once at most half of the rows still run, the finished
    ones leave every cache at once (the step's ``reorder``), their results kept.
    ``greedy_rows``: one greedy row per input after the B x n rows (``decode_with_greedy``).
    ``sets``: G blocks of rows, one per parameter set (``decode_grouped``; ``generator``
    then one per set); a row leaves when its counterparts in every block finished."""
    pad, eos, n, device, expand, encoder_out, prefix, n_forced, max_len = _plan(model, sample, cfg, prefix_tokens,
                                                                              greedy_rows, sets)
    total_steps, rows = n_forced + max_len, expand.numel()
    groups = sets.count if sets is not None else 1
    step_fn = build_step(model, encoder_out, expand, total_steps, cfg.path, "candidate decoding",
                         *((sets.stack, groups) if sets else ()))
    sampling = cfg.strategy == "sample"
    options = dict(sample=True, temperature=cfg.temperature, topk=cfg.topk, topp=cfg.topp, epsilon=cfg.epsilon)
    n_sampled = rows - (expand.numel() // (n + 1) if greedy_rows else 0)  # the sampled rows come first

    # the running rows' state (row r of it is original row orig[r]); results of rows that
    # left are written to the final tensors when they leave
    final = {"tokens": torch.full((rows, max_len + 1), pad, dtype=torch.long, device=device),  # last column: discarded
             "lengths": torch.zeros(rows, dtype=torch.long, device=device),
             "scores": torch.zeros(rows, device=device),
             "finished": torch.zeros(rows, dtype=torch.bool, device=device)}
    state = {k: v.clone() for k, v in final.items()}
    orig = torch.arange(rows, device=device)
    done = torch.zeros(rows, dtype=torch.bool, device=device)  # finished, or at the length limit
    tokens = torch.full((rows,), eos, dtype=torch.long, device=device)  # the BOS
    any_done = False
    for step in range(total_steps):
        out_len = state["lengths"]
        lprobs = step_fn.step(tokens)
        lprobs[:, pad] = float("-inf")  # padding is never a choice (as in SequenceGenerator)
        if step < n_forced + cfg.min_len:
            lprobs[:, eos] = lprobs[:, eos].masked_fill(out_len < cfg.min_len, float("-inf"))
        free = prefix[:, step].eq(pad) if step < n_forced else None
        gen = ~done if free is None else ~done & free
        if sampling and groups > 1:  # each set's live free rows from its own generator, as if decoded alone
            chosen, per = torch.full_like(tokens, eos), tokens.numel() // groups
            for g in range(groups):
                idx = gen[g * per:(g + 1) * per].nonzero().squeeze(1) + g * per
                chosen[idx] = choose_tokens(lprobs[idx], generator=generator[g], **options)
        elif sampling:  # draws for the live free rows only, in row order: the random numbers of fairseq's path
            if free is None and not any_done and n_sampled == rows:
                chosen = choose_tokens(lprobs, generator=generator, **options)
            else:  # (a greedy row takes its argmax)
                idx = (gen & orig.lt(n_sampled)).nonzero().squeeze(1)
                chosen = lprobs.argmax(-1) if n_sampled < rows else torch.full_like(tokens, eos)
                chosen[idx] = choose_tokens(lprobs[idx], generator=generator, **options)
        else:
            chosen = lprobs.argmax(-1)
        if free is not None:
            chosen = torch.where(free, chosen, prefix[:, step])
        chosen = chosen.masked_fill(done, eos)
        state["tokens"].scatter_(1, out_len.masked_fill(~gen, max_len)[:, None], chosen[:, None])
        state["scores"] += lprobs.gather(1, chosen[:, None]).squeeze(1).masked_fill(~gen, 0)
        out_len += gen
        state["finished"] |= gen & chosen.eq(eos)
        done = state["finished"] | out_len.ge(max_len)
        tokens = chosen
        any_done = bool(done.any())
        if not any_done:
            continue
        live = (~done).view(groups, -1).any(0).nonzero().squeeze(1)  # rows of a block (each block, G = 1)
        if live.numel() == 0:
            break
        if 2 * live.numel() * groups <= done.numel() and step + 1 < total_steps:  # compact: the finished rows leave
            if groups > 1:
                live = (live[None] + torch.arange(groups, device=device)[:, None] * (done.numel() // groups)).view(-1)
            left = done.nonzero().squeeze(1)
            for k, v in state.items():
                final[k].index_copy_(0, orig[left], v[left])
            state = {k: v.index_select(0, live) for k, v in state.items()}
            orig, done, tokens = orig[live], done[live], tokens[live]
            prefix = prefix[live] if prefix is not None else None
            step_fn.reorder(live)
            any_done = groups > 1 and bool(done.any())  # a block's row stays while its counterparts run
    for k, v in state.items():
        final[k].index_copy_(0, orig, v)
    out_len = final["lengths"]
    width = max(int(out_len.max().item()), 1) if rows > 0 else 1
    return Candidates(final["tokens"][:, :width], out_len, final["scores"], final["finished"], n)


def _plan(model, sample, cfg, prefix_tokens, greedy_rows=False, sets: Optional[ParameterSets] = None):
    """What both greedy / sampling paths start from: (pad, eos, n, device, expand, the
    encoder's output for the B inputs (None for a decoder-only model), the forced
    prefix of each of the B x n rows, its length, the maximum generated length);
    ``expand`` (B x n,) is each row's input (then each input once more: ``greedy_rows``).
    ``sets``: G blocks of those rows, block g with the encoder output of set g (the G
    encoder outputs one after another, ``expand`` indexing them)."""
    dictionary = model.decoder.dictionary
    net_input = sample["net_input"]
    device, n = net_input["src_tokens"].device, cfg.num_candidates
    encoder_out = None
    if _is_encoder_decoder(model) and sets is None:
        encoder_out = model.encoder.forward_torchscript(net_input)
    elif _is_encoder_decoder(model):
        encoder_out = _encode_sets(model.encoder, net_input, sets)
    elif prefix_tokens is None:
        raise ValueError("a decoder-only model needs prefix_tokens (the prompt) to continue")
    inputs = torch.arange(net_input["src_tokens"].size(0), device=device)
    expand = torch.cat([inputs.repeat_interleave(n), inputs]) if greedy_rows else inputs.repeat_interleave(n)
    prefix = prefix_tokens.index_select(0, expand) if prefix_tokens is not None else None
    if sets is not None:
        prefix = prefix.repeat(sets.count, 1) if prefix is not None else None
        expand = torch.cat([expand + g * inputs.numel() for g in range(sets.count)]) if encoder_out is not None \
            else expand.repeat(sets.count)
    n_forced = prefix.size(1) if prefix is not None else 0
    return (dictionary.pad(), dictionary.eos(), n, device, expand, encoder_out, prefix, n_forced,
            max_decode_length(model, sample, cfg))


def _encode_sets(encoder, net_input: Dict, sets: ParameterSets) -> Dict[str, List[Tensor]]:
    """The encoder's output for every parameter set, the sets' batches one after another
    (what the static-cache step reads)."""
    args = {k: v for k, v in net_input.items() if k != "prev_output_tokens"}
    named = list(encoder.named_parameters())
    outs = [torch.func.functional_call(encoder, {name: sets.stack(p)[g] for name, p in named}, (), args)
            for g in range(sets.count)]
    if isinstance(outs[0], tuple):  # fairseq's LSTM encoder: (outputs, hiddens, cells, padding mask), batch dim 1
        return tuple(torch.cat(parts, dim=1) for parts in zip(*outs))
    masks = [o["encoder_padding_mask"][0] for o in outs if len(o["encoder_padding_mask"]) > 0]
    return {"encoder_out": [torch.cat([o["encoder_out"][0] for o in outs], dim=1)],
            "encoder_padding_mask": [torch.cat(masks)] if len(masks) == len(outs) else []}


def _beam(model, sample, cfg, prefix_tokens) -> Candidates:
    from fairseq.sequence_generator import SequenceGenerator

    dictionary = model.decoder.dictionary
    pad, eos = dictionary.pad(), dictionary.eos()
    beam = cfg.beam_size or cfg.num_candidates
    if beam < cfg.num_candidates:
        raise ValueError(f"beam_size ({beam}) must be >= num_candidates ({cfg.num_candidates})")
    max_len = max_decode_length(model, sample, cfg)
    n_forced = prefix_tokens.size(1) if prefix_tokens is not None else 0
    gen = SequenceGenerator(
        [model], dictionary, beam_size=beam, max_len_a=0, max_len_b=max_len + n_forced, min_len=cfg.min_len,
        normalize_scores=True,
    )
    hypos = gen.generate([model], sample, prefix_tokens=prefix_tokens)
    rows: List[Tensor] = []
    scores: List[Tensor] = []
    for i, nbest in enumerate(hypos):
        p = int(prefix_tokens[i].ne(pad).sum()) if prefix_tokens is not None else 0
        for h in nbest[: cfg.num_candidates]:
            rows.append(h["tokens"][p:])
            scores.append(h["positional_scores"][p:].sum())
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    width = max(int(lengths.max().item()), 1)
    tokens = torch.full((len(rows), width), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = r
    finished = torch.tensor([bool(len(r)) and int(r[-1]) == eos and len(r) <= max_len for r in rows])
    return Candidates(tokens, lengths, torch.stack(scores), finished, cfg.num_candidates)
