#!/usr/bin/env python
"""Fingerprint of a fairseq checkpoint's model parameters.

``model_fingerprint.py CHECKPOINT`` prints the sha256 of the model's parameters and
buffers (names in sorted order, each with its dtype, shape and bytes): two
checkpoints of the same model print the same line whatever else they hold
(optimizer state, training counters, a model-only copy), and a model that differs
in one bit of one parameter prints another. ``--json FILE`` also writes
``{"sha256", "checkpoint", "tensors", "params"}`` to FILE (scripts/keep_results.py
keeps ``*.json``); ``--check FILE`` fails, with one line naming both, when FILE records
another model than CHECKPOINT.

Why: the recipes keep their results between sessions but not their models, and a
retrained model is not the same model (issue 22: the Multi30k CMLM trained again with
the same command and seed gave other Mask-Predict hypotheses for 40 of 50 sentences).
examples/lib.sh's ``same_model`` records this fingerprint beside a recipe's rows and
refuses to add rows of another model to them.

The checkpoint is unpickled in full (``weights_only=False``): fingerprint only
checkpoints you trust, as fairseq's own loader does."""
import argparse
import hashlib
import json
import sys

import torch


def fingerprint(state_dict):
    """(sha256 hex, number of tensors, number of elements) of a model state dict."""
    h = hashlib.sha256()
    n_tensors = n_elem = 0
    for name in sorted(state_dict):
        t = state_dict[name]
        if not torch.is_tensor(t):
            continue
        t = t.detach().cpu().contiguous()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        n_tensors += 1
        n_elem += t.numel()
    return h.hexdigest(), n_tensors, n_elem


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="a fairseq checkpoint (a dict with a 'model' state dict)")
    p.add_argument("--json", metavar="FILE", help="also write the fingerprint to FILE as JSON")
    p.add_argument("--check", metavar="FILE",
                   help="fail when FILE (a --json output) records another model than CHECKPOINT")
    args = p.parse_args(argv)
    try:
        state = torch.load(args.checkpoint, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError) as e:
        sys.exit(f"model_fingerprint.py: cannot read checkpoint {args.checkpoint}: {e}")
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        sys.exit(f"model_fingerprint.py: {args.checkpoint} is not a fairseq checkpoint (no 'model' state dict)")
    sha, n_tensors, n_elem = fingerprint(state["model"])
    if args.check:
        kept = json.load(open(args.check))["sha256"]
        if kept != sha:
            sys.exit(f"model_fingerprint.py: {args.check} records another model than {args.checkpoint} "
                     f"(parameters' sha256 {kept[:12]}..., not {sha[:12]}...): move the results beside it "
                     "aside or pass the model they came from")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sha256": sha, "checkpoint": args.checkpoint, "tensors": n_tensors,
                       "params": n_elem}, f, indent=1)
            f.write("\n")
    print(sha)


if __name__ == "__main__":
    main()
