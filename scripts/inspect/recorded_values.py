#!/usr/bin/env python
"""Values a refactoring must leave unchanged, recorded seed for seed: every criterion's loss,
logged values and gradient on a fixed batch, on both decoding paths; the candidates each decoding
strategy draws; MBR's choices. Run it on two trees and compare the two JSON files.

usage:
    python scripts/inspect/recorded_values.py OUT.json            # record (about 1 min on 2 cores)
    python scripts/inspect/recorded_values.py --compare A.json B.json

The models are the tiny, untrained configurations of ``synthetic.tiny_models`` on the toy corpus
(``synthetic.toy``), built from seed 1, dropout 0; each case reseeds torch before it runs, so the
values depend on the code alone. ``--compare`` prints each value that differs (relative
difference above 1e-6) and exits 1 when one does.
"""
import argparse
import json
import math
import os
import sys
import tempfile

CRITERIA = {
    "mgs": ["--criterion", "mgs", "--mgs-task-loss", "edit"],
    "mgs-sample": ["--criterion", "mgs", "--mgs-task-loss", "edit", "--mgs-decoder", "sample"],
    "mgs-sequential": ["--criterion", "mgs", "--mgs-task-loss", "edit", "--mgs-candidate-evaluation", "sequential"],
    "mrt": ["--criterion", "mrt", "--mrt-task-loss", "edit"],
    "mrt-sample": ["--criterion", "mrt", "--mrt-task-loss", "edit", "--mrt-decoder", "sample", "--mrt-candidates", "4"],
    "mgs-lm": ["--criterion", "mgs", "--mgs-task-loss", "lm(normalize=true)"],
    "mrt-mixed": ["--criterion", "mrt", "--mrt-task-loss", "chrf(beta=1)=1,edit=0.5,rep=0.2,nonterm=0.1"],
    "pg": ["--criterion", "pg", "--pg-task-loss", "edit"],
    "pg-greedy": ["--criterion", "pg", "--pg-task-loss", "edit", "--pg-baseline", "greedy"],
    "dss": ["--criterion", "differentiable_scheduled_sampling"],
    "dss-sample": ["--criterion", "differentiable_scheduled_sampling", "--dss-mode", "soft-sample"],
    "soft-beam": ["--criterion", "soft_beam_direct_loss"],
    "soft-beam-hinge": ["--criterion", "soft_beam_hinge"],
    "self-normalized": ["--criterion", "self_normalized_ce"],
}
ARCHS = ("transformer", "lstm")
PATHS = ("static-cache", "fairseq")
DECODES = {"greedy": {}, "sample": {"strategy": "sample", "num_candidates": 3},
           "sample-topk": {"strategy": "sample", "num_candidates": 2, "topk": 3},
           "beam": {"strategy": "beam", "num_candidates": 2}}


def _numbers(log: dict) -> dict:
    """The logged numbers, timings left out."""
    return {k: float(v) for k, v in sorted(log.items())
            if (isinstance(v, (int, float)) or hasattr(v, "item")) and "seconds" not in k}


def _criterion_values(data: str, arch: str, name: str, path: str) -> dict:
    import torch

    from fairseq_ext.synthetic import tiny_models

    path_option = ["--decoding-path", path] if name != "self-normalized" else []  # it decodes nothing
    task, model, args = tiny_models.build_task_and_model(
        data, "translation", arch, [*CRITERIA[name], *path_option, "--dropout", "0"], seed=1)
    task.load_dataset("valid")
    ds = task.dataset("valid")
    sample = ds.collater([ds[i] for i in range(6)])
    crit = task.build_criterion(args)
    torch.manual_seed(7)
    model.train()
    loss, size, log = crit(model, sample)
    loss.backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
    model.zero_grad()
    model.eval()
    with torch.no_grad():
        _, _, valid = crit(model, sample)
    return {"loss": float(loss.detach()), "sample_size": float(size), "log": _numbers(log), "valid": _numbers(valid),
            "grad_norm": float(grads.double().norm()), "grad_head": grads[:8].tolist()}


def _decode_values(data: str, arch: str, strategy: str, path: str) -> dict:
    import torch

    from fairseq_ext.decoding.candidates import DecodeConfig, decode_candidates
    from fairseq_ext.synthetic import tiny_models

    task, model, _ = tiny_models.build_task_and_model(data, "translation", arch, ["--dropout", "0"], seed=1)
    task.load_dataset("valid")
    ds = task.dataset("valid")
    sample = ds.collater([ds[i] for i in range(8)])
    cand = decode_candidates(model, sample, DecodeConfig(path=path, max_len_b=12, **DECODES[strategy]),
                             generator=torch.Generator().manual_seed(3))
    return {"tokens": [r.tolist() for r in cand.as_list()], "scores": cand.scores.tolist(),
            "finished": cand.finished.tolist()}


def _mbr_values(data: str) -> dict:
    import torch

    from fairseq_ext.synthetic import tiny_models

    task, model, args = tiny_models.build_task_and_model(
        data, "translation_mbr", "transformer", ["--dropout", "0", "--mbr-task-loss", "edit",
                                                  "--mbr-num-candidates", "6"], seed=1)
    task.load_dataset("valid")
    ds = task.dataset("valid")
    sample = ds.collater([ds[i] for i in range(6)])
    generator = task.build_generator([model.eval()], args)
    torch.manual_seed(5)
    hypos = task.inference_step(generator, [model], sample)
    return {"choices": [h[0]["tokens"].tolist() for h in hypos], "scores": [float(h[0]["score"]) for h in hypos]}


def _case(job):
    """One case in a forked process (fairseq's parser is built afresh for each)."""
    key, data = job
    kind, *rest = key.split("/")
    try:
        if kind == "criterion":
            name, arch, path = rest
            return key, _criterion_values(data, arch, name, path)
        if kind == "decode":
            strategy, arch, path = rest
            return key, _decode_values(data, arch, strategy, path)
        return key, _mbr_values(data)
    except (Exception, SystemExit) as err:  # a criterion that refuses the architecture: its message is the value
        return key, {"refused": f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"}


def record(out: str) -> None:
    import multiprocessing

    import torch  # noqa: F401  (imported once, before the forks)

    import fairseq_ext  # noqa: F401
    from fairseq_ext.synthetic import toy

    keys = [f"criterion/{name}/{arch}/{path}" for arch in ARCHS for path in PATHS for name in CRITERIA]
    keys += [f"decode/{strategy}/{arch}/{path}" for arch in ARCHS for path in PATHS for strategy in DECODES]
    keys += ["mbr/transformer"]
    with tempfile.TemporaryDirectory() as tmp:
        data = toy.binarize_translation(toy.write_toy_data(os.path.join(tmp, "raw"), sizes=(300, 40, 40), seed=1),
                                        os.path.join(tmp, "bin"))
        with multiprocessing.get_context("fork").Pool(2, maxtasksperchild=1) as pool:
            values = dict(pool.imap(_case, [(key, data) for key in keys]))
    with open(out, "w") as f:
        json.dump(values, f, indent=1, sort_keys=True)
    refused = sorted(key for key, v in values.items() if "refused" in v)
    print(f"recorded {len(values)} cases to {out}; refused: {refused}", file=sys.stderr)


def _differences(a, b, where: str = ""):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                yield f"{where}/{k}: only in {'the second' if k not in a else 'the first'}"
            else:
                yield from _differences(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _differences(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        same = (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-6 * max(abs(a), abs(b)) + 1e-12
        if not same:
            yield f"{where}: {a!r} != {b!r}"
    elif a != b:
        yield f"{where}: {a!r} != {b!r}"


def compare(first: str, second: str) -> int:
    a, b = json.load(open(first)), json.load(open(second))
    found = list(_differences(a, b))
    for line in found:
        print(line)
    print(f"{len(a)} cases, {len(found)} differences", file=sys.stderr)
    return 1 if found else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", help="the JSON file to write")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two recorded files")
    args = parser.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    if not args.out:
        parser.error("give OUT.json or --compare A B")
    record(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
