"""Minimum Bayes risk decoding for fairseq-generate (``--task translation_mbr``).

Per input: N candidates (epsilon or ancestral samples, beam n-best, or read from a
file), pseudo-references (the candidates themselves, or a separate sample), the cost
matrix under any plugin cost (``costs.cost_matrix``), and the candidates ranked by
Bayes risk, the expected cost under the model (``core.mbr``): exactly, against the
aggregate of the references, or with confidence-based pruning. Identical candidates are
scored once (a sample repeats itself); identical references count with their
multiplicity. The output is fairseq-generate's: the hypotheses of an input in order of
increasing risk, each with the model's length-normalised log-probability as its score
and its token log-probabilities; ``--mbr-output-file`` adds every candidate's risk (and,
with ``--mbr-output-matrix``, the cost matrix) as JSON lines.
"""
import json
import logging
import time
from typing import Dict, List, Optional, Tuple

import torch
from fairseq import utils
from torch import Tensor

from fairseq_ext.core.mbr import bayes_risk, prune, ranking
from fairseq_ext.core.sampling import batch_generator
from fairseq_ext.costs.batch_scorer import BatchScorer
from fairseq_ext.costs.cost_matrix import CostMatrix, not_aggregatable
from fairseq_ext.decoding.batch import decode_batch
from fairseq_ext.decoding.candidates import DecodeConfig
from fairseq_ext.evaluation.generate_output import parse
from fairseq_ext.runtime.cli import ConfigError
from fairseq_ext.scoring.teacher_forced import token_log_probs

logger = logging.getLogger(__name__)

CANDIDATES = ("epsilon", "sample", "beam", "file")
REFERENCES = ("candidates", "sample")


def read_candidates(path: str, dictionary) -> Dict[int, List[Tensor]]:
    """{sentence id: candidates as id tensors ending in EOS} from ``path``: the ``H-`` lines of
    a fairseq-generate output written without ``--post-process`` (the target dictionary's
    symbols), or lines ``ID<TAB>SYMBOLS``. A missing, empty or unreadable file: ConfigError."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"--mbr-candidates-file {path}: cannot read it ({err.strerror or err})") from None
    texts = parse(lines)["H"]
    if not texts:  # ID<TAB>SYMBOLS
        for number, line in enumerate(lines, 1):
            sid, sep, text = line.partition("\t")
            if not line.strip():
                continue
            if not sep or not sid.strip().isdigit():
                raise ConfigError(f"--mbr-candidates-file {path}: line {number} is neither an H- line of "
                                  "fairseq-generate nor ID<TAB>SYMBOLS")
            texts.setdefault(int(sid), []).append(text)
    if not texts:
        raise ConfigError(f"--mbr-candidates-file {path}: no candidates in it")
    return {sid: [dictionary.encode_line(t, add_if_not_exist=False, append_eos=True).long() for t in items]
            for sid, items in texts.items()}


def _unique(rows: List[Tensor]) -> Tuple[List[Tensor], List[int], List[int]]:
    """(distinct rows in order of first occurrence, how often each occurs, the distinct index of every row)."""
    index: Dict[tuple, int] = {}
    distinct, counts, of_row = [], [], []
    for row in rows:
        key = tuple(row.tolist())
        if key not in index:
            index[key] = len(distinct)
            distinct.append(row)
            counts.append(0)
        counts[index[key]] += 1
        of_row.append(index[key])
    return distinct, counts, of_row


class MBRGenerator:
    """fairseq-generate's generator for ``translation_mbr``; ``cfg``: the task's config,
    ``args``: fairseq's generation options (``--max-len-a/b``, ``--min-len``, ``--nbest``)."""

    def __init__(self, models, task, cfg, args):
        if len(models) != 1:
            raise ConfigError("--task translation_mbr decodes with one model (no ensembles)")
        self.model, self.task, self.cfg = models[0], task, cfg
        self.dictionary = task.target_dictionary
        self.eos = self.dictionary.eos()  # fairseq-generate strips it from the printed text
        self.nbest = int(getattr(args, "nbest", 1) or 1)
        self.scorer = BatchScorer(task, cfg.mbr_task_loss, post_process=cfg.mbr_post_process,
                                  score_model=cfg.mbr_score_model, criterion="mbr")
        self.scorer.bind_model(self.model)
        self.qe = not any(cost.needs_reference for cost in self.scorer.costs.values())
        self.prefilter = None
        if cfg.mbr_prefilter_task_loss is not None:
            self.prefilter = BatchScorer(task, cfg.mbr_prefilter_task_loss, post_process=cfg.mbr_post_process,
                                         score_model=cfg.mbr_score_model, criterion="mbr-prefilter")
            self.prefilter.bind_model(self.model)
            if any(cost.needs_reference for cost in self.prefilter.costs.values()):
                raise ConfigError(f"--mbr-prefilter-task-loss {cfg.mbr_prefilter_task_loss}: the pre-filter ranks the "
                                  "candidates without a reference; this cost reads one")
        if cfg.mbr_aggregate and not self.qe:
            missing = not_aggregatable(self.scorer)
            if missing:
                raise ConfigError(f"--mbr-aggregate: {', '.join(missing)} has no aggregated form (sbleu, chrf, comet "
                                  "with a regression model such as Unbabel/wmt22-comet-da, and costs derived from "
                                  "EmbeddingCost have one)")
        n, kind = cfg.mbr_num_candidates, str(cfg.mbr_candidates)
        limits = dict(max_len_a=float(getattr(args, "max_len_a", 0.0)), max_len_b=int(getattr(args, "max_len_b", 200)),
                      min_len=int(getattr(args, "min_len", 1)))
        sampling = dict(strategy="sample", temperature=cfg.mbr_temperature, topk=cfg.mbr_topk, topp=cfg.mbr_topp,
                        epsilon=cfg.mbr_epsilon if kind == "epsilon" else None, **limits)
        self.candidate_cfg = (DecodeConfig(num_candidates=n, **sampling) if kind in ("epsilon", "sample") else
                              DecodeConfig(strategy="beam", num_candidates=n, beam_size=n, **limits))
        self.file = read_candidates(cfg.mbr_candidates_file, self.dictionary) if kind == "file" else None
        m = cfg.mbr_num_references or n
        self.reference_cfg = DecodeConfig(num_candidates=m, **sampling) if str(cfg.mbr_references) == "sample" else None
        self.schedule = [int(x) for x in str(cfg.mbr_prune_schedule).split(",") if x.strip()]
        self.output = open(cfg.mbr_output_file, "w", encoding="utf-8") if cfg.mbr_output_file else None
        self.totals = {"sentences": 0, "evaluations": 0, "cost_seconds": 0.0, "decode_seconds": 0.0,
                       "prefilter_seconds": 0.0, "utility_seconds": 0.0}
        self._text_ready = False
        refs = ("none: the cost reads no reference (reranking by the cost)" if self.qe else
                f"{m} samples" if self.reference_cfg is not None else "the candidates")
        how = ("reference aggregation" if cfg.mbr_aggregate else
               f"pruning (alpha {cfg.mbr_prune_alpha}, schedule {cfg.mbr_prune_schedule})"
               if cfg.mbr_prune_alpha is not None else "the full cost matrix")
        logger.info(f"MBR: {n} candidates ({self._describe(kind)}), pseudo-references: {refs}, cost "
                    f"{cfg.mbr_task_loss}, {how}")

    def _describe(self, kind: str) -> str:
        c = self.cfg
        if kind == "file":
            return f"from {c.mbr_candidates_file}"
        if kind == "beam":
            return "beam n-best"
        filters = [f"epsilon {c.mbr_epsilon}"] if kind == "epsilon" else []
        filters += [f"top-k {c.mbr_topk}"] if c.mbr_topk > 0 else []
        filters += [f"top-p {c.mbr_topp}"] if c.mbr_topp < 1 else []
        return "sampling, " + ", ".join(filters + [f"temperature {c.mbr_temperature}"])

    def _configure_text(self) -> None:
        """Text costs see the text fairseq-generate prints (``--bpe`` / ``--tokenizer``, which the
        task recorded, or its ``--eval-bleu-detok``), set once."""
        if not self._text_ready:
            self.scorer.configure_text(self.task.text_config(), self.task)
            self._text_ready = True

    def _candidates(self, sample: Dict, gen: torch.Generator) -> List[List[Tensor]]:
        if self.file is not None:
            missing = [int(i) for i in sample["id"].tolist() if int(i) not in self.file]
            if missing:
                raise ConfigError(f"--mbr-candidates-file {self.cfg.mbr_candidates_file}: no candidates for "
                                  f"sentence {missing[0]}")
            return [self.file[int(i)] for i in sample["id"].tolist()]
        return self._decode(sample, self.candidate_cfg, gen)

    def _decode(self, sample: Dict, cfg: DecodeConfig, gen: torch.Generator) -> List[List[Tensor]]:
        cand = decode_batch(self.model, sample, cfg, gen).candidates
        rows = cand.as_list()
        n = cand.num_per_input
        return [rows[i * n:(i + 1) * n] for i in range(len(rows) // n)]

    def _risk(self, matrix: CostMatrix, ref_counts: List[int], ref_draws: List[int],
              gen: torch.Generator) -> Tuple[Tensor, Tensor]:
        """(candidates in output order, their risk; NaN for those pruned)."""
        cfg = self.cfg
        weights = torch.tensor(ref_counts, dtype=torch.float64)
        if not matrix.needs_references:
            risk = matrix.free.clone()
        elif cfg.mbr_aggregate:
            risk = matrix.aggregated(weights.tolist())
        elif cfg.mbr_prune_alpha is not None and matrix.num_hyps > self.nbest:
            draws = torch.tensor(ref_draws)
            result = prune(lambda rows, start, stop: matrix.block(rows, draws[start:stop]), matrix.num_hyps,
                           len(ref_draws), self.schedule, cfg.mbr_prune_alpha, cfg.mbr_prune_bootstrap, gen)
            risk = torch.full((matrix.num_hyps,), float("nan"), dtype=torch.float64)
            risk[result.survivors] = result.risk
            pruned = [i for i in range(matrix.num_hyps) if i not in set(result.survivors.tolist())]
            return torch.cat([result.survivors, torch.tensor(pruned, dtype=torch.long)]), risk
        else:
            risk = bayes_risk(matrix.full(), weights)
        return ranking(risk), risk

    @torch.no_grad()
    def generate(self, models, sample: Dict, prefix_tokens: Optional[Tensor] = None, **kwargs) -> List[List[Dict]]:
        if prefix_tokens is not None:
            raise ConfigError("--task translation_mbr: --prefix-size is not supported (candidates are whole outputs)")
        self._configure_text()
        start = time.perf_counter()
        gen = batch_generator(self.cfg.seed, sample["id"])  # the same draws whatever the batch's position
        candidates = self._candidates(sample, gen)
        references = (self._decode(sample, self.reference_cfg, gen) if self.reference_cfg is not None and not self.qe
                      else candidates)
        decoded, prefiltered = time.perf_counter(), self.totals["prefilter_seconds"]
        pad = self.dictionary.pad()
        sources = [utils.strip_pad(x, pad) for x in sample["net_input"]["src_tokens"]]
        chosen, records = [], []
        for b, rows in enumerate(candidates):
            hyps, counts, _ = _unique(rows)
            refs, ref_counts, ref_draws = _unique(references[b])
            device = sample["net_input"]["src_tokens"].device
            screened = None
            if self.prefilter is not None:  # QE pre-filtering: the K best by the reference-free cost
                started = time.perf_counter()
                quality = CostMatrix(self.prefilter, hyps, [], sources[b], device=device).free
                kept = sorted(torch.argsort(quality, stable=True)[:self.cfg.mbr_prefilter_k].tolist())
                screened = (hyps, quality, kept, time.perf_counter() - started)
                hyps, counts = [hyps[i] for i in kept], [counts[i] for i in kept]
                self.totals["prefilter_seconds"] += screened[3]
            started = time.perf_counter()
            matrix = CostMatrix(self.scorer, hyps, refs, sources[b], device=device)
            order, risk = self._risk(matrix, ref_counts, ref_draws, gen)
            seconds = {"sampling": (decoded - start) / len(candidates),  # the batch's decoding, shared alike
                       "prefilter": screened[3] if screened is not None else 0.0, "utility": matrix.seconds,
                       "selection": time.perf_counter() - started - matrix.seconds}
            self.totals["utility_seconds"] += seconds["utility"]
            chosen.append([hyps[i] for i in order[:self.nbest].tolist()])
            self.totals["evaluations"] += matrix.evaluations
            if self.output is not None:
                records.append(self._record(int(sample["id"][b]), hyps, counts, refs, ref_counts, order, risk, matrix,
                                            screened, seconds))
        self.totals["cost_seconds"] += time.perf_counter() - decoded - (self.totals["prefilter_seconds"] - prefiltered)
        self.totals["decode_seconds"] += decoded - start
        out = self._hypotheses(sample, chosen)
        self._report(len(candidates), records)
        return out

    def _hypotheses(self, sample: Dict, chosen: List[List[Tensor]]) -> List[List[Dict]]:
        """fairseq-generate's hypotheses: tokens, the model's mean token log-probability as score,
        the token log-probabilities; one teacher-forced pass for every output of the batch."""
        rows = [h for per_input in chosen for h in per_input]
        index = torch.tensor([b for b, per_input in enumerate(chosen) for _ in per_input])
        device = sample["net_input"]["src_tokens"].device
        was_training = self.model.training
        self.model.eval()
        try:
            lp = token_log_probs(self.model, sample, [r.to(device) for r in rows], index.to(device)).float().cpu()
        finally:
            self.model.train(was_training)
        out, k = [], 0
        for per_input in chosen:
            hypos = []
            for h in per_input:
                positional = lp[k, :len(h)].clone()
                hypos.append({"tokens": h.cpu(), "score": positional.mean() if len(h) else torch.tensor(0.0),
                              "positional_scores": positional, "alignment": None})
                k += 1
            out.append(hypos)
        return out

    def _record(self, sid, hyps, counts, refs, ref_counts, order, risk, matrix, screened=None, seconds=None) -> Dict:
        post = self.scorer.post_process

        def text(t):
            return self.dictionary.string(t, post)

        record = {"id": sid, "candidates": [text(h) for h in hyps], "count": counts,
                  "risk": [None if torch.isnan(r) else round(float(r), 6) for r in risk],
                  "order": order.tolist(), "evaluations": matrix.evaluations}
        if not self.qe:
            record.update(references=[text(r) for r in refs], reference_count=ref_counts)
        if screened is not None:  # every distinct candidate, its pre-filter cost, the indices kept
            every, quality, kept, _ = screened
            record["prefilter"] = {"candidates": [text(h) for h in every], "cost": [round(float(q), 6) for q in quality],
                                   "kept": kept}
        if seconds is not None:  # this sentence's time in each stage (sampling: its share of the batch's)
            record["seconds"] = {k: round(v, 6) for k, v in seconds.items()}
        if self.cfg.mbr_output_matrix:
            values = matrix.values + matrix.free[:, None] if matrix.needs_references else matrix.free[:, None]
            record["matrix"] = [[None if torch.isnan(v) else round(float(v), 6) for v in row] for row in values]
        return record

    def _report(self, sentences: int, records: List[Dict]) -> None:
        before = self.totals["sentences"]
        self.totals["sentences"] += sentences
        if self.output is not None:
            for record in records:
                self.output.write(json.dumps(record) + "\n")
            self.output.flush()
        if before // 500 != self.totals["sentences"] // 500:
            t = self.totals
            logger.info(f"MBR: {t['sentences']} sentences, {t['evaluations']} cost evaluations, "
                        f"{t['decode_seconds']:.1f} s decoding, "
                        + (f"{t['prefilter_seconds']:.1f} s pre-filter, " if self.prefilter is not None else "")
                        + f"{t['utility_seconds']:.1f} s utility, "
                        f"{t['cost_seconds'] - t['utility_seconds']:.1f} s selection")
