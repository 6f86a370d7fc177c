"""Rerank your own candidate continuations with a residual EBM (Deng et al., 2020): each
candidate y of a prompt x gets the joint model's unnormalised log-probability

    score(x, y) = log P_LM(y | x) - E(x, y)

(the base LM's log-probability of the continuation minus the energy of the whole sequence;
log Z does not depend on y, so the order is the joint model's), and the candidates of each
prompt are written best first:

    python -m fairseq_ext.rerank_residual --energy ebm/checkpoint_best.pt --base-lm lm.pt --data DATA \\
        --candidates nbest.out --output reranked.jsonl

Candidates (``--candidates``), in the data's dictionary symbols (BPE pieces, as ``dict.txt``):

* a fairseq-generate output of the base LM (``--nbest N``, no ``--post-process``): its ``H-``
  lines, grouped by sentence id; each hypothesis is the prompt's first ``--prefix-len`` tokens
  (default: the energy model's ``--residual-prefix-len``) followed by the continuation;
* or JSONL, one prompt a line: ``{"prefix": "...", "candidates": ["...", ...]}`` (an ``id``
  field is kept).

``--output`` gets one JSON line per prompt: its id, prefix and candidates best first, each with
``lm_log_prob``, ``energy`` and ``score``; stdout one line: prompts, candidates, and how many
prompts' top candidate changed against the base LM's own order. The energy model was trained
on continuations of ``--residual-continuation-len`` tokens; candidates of other lengths are
scored, with a warning, since its energies are calibrated on that length only.
"""
import argparse
import json
import logging
import os
import sys
from typing import Dict, List, Optional, Sequence

logger = logging.getLogger("fairseq_ext.rerank_residual")


def read_candidates(path: str, prefix_len: int) -> List[Dict]:
    """[{"id", "prefix", "candidates"}] from a fairseq-generate output or a JSONL file (texts
    as space-separated symbols)."""
    with open(path, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    first = next((line for line in lines if line.strip()), "")
    if first.startswith("{"):
        prompts = []
        for i, line in enumerate(lines):
            if line.strip():
                record = json.loads(line)
                if "prefix" not in record or not record.get("candidates"):
                    raise ValueError(f"--candidates {path}: line {i + 1} has no 'prefix' or no 'candidates'")
                prompts.append({"id": record.get("id", len(prompts)), "prefix": record["prefix"],
                                "candidates": list(record["candidates"])})
        return prompts
    from fairseq_ext.evaluation.generate_output import parse

    hyps = parse(lines)["H"]
    if not hyps:
        raise ValueError(f"--candidates {path}: neither JSONL nor a fairseq-generate output (no H- lines)")
    prompts = []
    for sid in sorted(hyps):
        words = [h.split() for h in hyps[sid]]
        if any(len(w) <= prefix_len for w in words):
            raise ValueError(f"--candidates {path}: a hypothesis of sentence {sid} has no token after the "
                             f"{prefix_len}-token prefix (--prefix-len)")
        prefixes = {" ".join(w[:prefix_len]) for w in words}
        if len(prefixes) != 1:
            raise ValueError(f"--candidates {path}: the hypotheses of sentence {sid} start with different "
                             f"{prefix_len}-token prefixes (--prefix-len)")
        prompts.append({"id": sid, "prefix": prefixes.pop(), "candidates": [" ".join(w[prefix_len:]) for w in words]})
    return prompts


def score_prompt(lm, energy_model, dictionary, prefix: str, candidates: Sequence[str]) -> List[Dict]:
    """The candidates of one prompt with their base-LM log-probability, energy and score, in the
    given order; candidates of one length are scored in one batch."""
    import torch

    from fairseq_ext.generators.joint_sampler import lm_log_prob

    def encode(text):
        return dictionary.encode_line(text, add_if_not_exist=False, append_eos=False).long()

    p = encode(prefix)
    device = next(energy_model.parameters()).device
    seqs = [torch.cat([p, encode(c)]).to(device) for c in candidates]
    out: List[Optional[Dict]] = [None] * len(candidates)
    by_length: Dict[int, List[int]] = {}
    for i, s in enumerate(seqs):
        by_length.setdefault(len(s), []).append(i)
    with torch.no_grad():
        for idx in by_length.values():
            batch = torch.stack([seqs[i] for i in idx])
            lp = lm_log_prob(lm, batch, len(p)).double().sum(1)
            energy = energy_model(batch).double()
            for j, i in enumerate(idx):
                out[i] = {"text": candidates[i], "lm_log_prob": float(lp[j]), "energy": float(energy[j]),
                          "score": float(lp[j] - energy[j])}
    return out


def main(argv: Optional[Sequence[str]] = None) -> None:
    from fairseq_ext.runtime import cli

    cli.install()
    p = argparse.ArgumentParser(prog="python -m fairseq_ext.rerank_residual", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--energy", required=True, help="the residual EBM's checkpoint (fairseq-train --task residual_lm)")
    p.add_argument("--base-lm", required=True, help="its base LM (the --residual-base-lm it was trained with)")
    p.add_argument("--data", required=True, help="the data directory holding its dict.txt")
    p.add_argument("--candidates", required=True, help="fairseq-generate --nbest output, or JSONL (see above)")
    p.add_argument("--output", required=True, help="JSONL written here: each prompt's candidates, best first")
    p.add_argument("--prefix-len", type=int, default=None,
                   help="with fairseq-generate output: tokens of each hypothesis that are the prompt (default: the "
                        "energy model's --residual-prefix-len)")
    p.add_argument("--cpu", action="store_true", help="score on the CPU even where CUDA is available")
    a = p.parse_args(argv)
    for option, path in (("--energy", a.energy), ("--base-lm", a.base_lm), ("--candidates", a.candidates)):
        if not os.path.isfile(path):
            p.error(f"{option} {path}: no such file")
    if not os.path.isfile(os.path.join(a.data, "dict.txt")):
        p.error(f"--data {a.data}: no dict.txt there")
    if a.prefix_len is not None and a.prefix_len < 1:
        p.error(f"--prefix-len must be >= 1, got {a.prefix_len}")
    import torch
    from fairseq import checkpoint_utils

    import fairseq_ext  # noqa: F401  (registers residual_lm and residual_energy)
    from fairseq_ext.runtime.cli import ConfigError

    try:
        models, _, task = checkpoint_utils.load_model_ensemble_and_task(
            [a.energy], arg_overrides={"data": a.data, "residual_base_lm": a.base_lm})
    except ConfigError as err:
        p.error(str(err))
    if task.__class__.__name__ != "ResidualLMTask":
        p.error(f"--energy {a.energy}: not a residual EBM (trained with --task residual_lm)")
    prefix_len = a.prefix_len or task.cfg.residual_prefix_len
    try:
        prompts = read_candidates(a.candidates, prefix_len)
    except (ValueError, json.JSONDecodeError) as err:
        p.error(str(err))
    device = "cuda" if torch.cuda.is_available() and not a.cpu else "cpu"
    energy_model, lm = models[0].to(device).eval(), task.base_lm.to(device)
    trained_len = task.cfg.residual_continuation_len
    changed = off_length = 0
    with open(a.output, "w", encoding="utf-8") as f:
        for prompt in prompts:
            scored = score_prompt(lm, energy_model, task.dictionary, prompt["prefix"], prompt["candidates"])
            off_length += sum(len(c["text"].split()) != trained_len for c in scored)
            ranked = sorted(scored, key=lambda c: -c["score"])
            changed += ranked[0]["text"] != max(scored, key=lambda c: c["lm_log_prob"])["text"]
            f.write(json.dumps({"id": prompt["id"], "prefix": prompt["prefix"], "candidates": ranked}) + "\n")
    if off_length:
        logger.warning(f"{off_length} candidates are not {trained_len} tokens long, the continuation length the "
                       "energy model was trained on (--residual-continuation-len): their energies are extrapolated")
    print(f"rerank_residual: {len(prompts)} prompts, {sum(len(x['candidates']) for x in prompts)} candidates; the "
          f"top candidate differs from the base LM's for {changed}; written to {a.output}", flush=True)


if __name__ == "__main__":
    logging.basicConfig(format="%(name)s: %(levelname)s: %(message)s", stream=sys.stderr)
    main()
