#!/usr/bin/env python
"""How a tagger scores the step after a future-dependent label, on the label-bias
task (fairseq_ext/synthetic/label_bias.py; examples/soft_beam/README.md, "Label bias").

For every F word i of the test split (which has a next word i+1), the decoder is
run teacher-forced on the gold labels up to i-1 and then y_i = the gold label
(a consistent prefix) or the other of A / B (an inconsistent one); printed: the
mean over positions of the best raw logit and the best log-probability of step
i+1 after each prefix, and how often the consistent prefix's best step-(i+1)
score is the higher one (what a beam needs to keep the right hypothesis: the two
prefixes' scores up to i-1 are equal); the mean gap between the scores of A
and B at the F word; and how often the consistent prefix is
ahead after step i+1 (score of y_i plus the best score of step i+1): where the
beam would keep the right hypothesis, as far as the next step decides.

usage: python scripts/inspect/label_bias_probe.py CHECKPOINT DATA_DIR CACHE_DIR
"""
import argparse

import torch



def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("data")
    p.add_argument("cache_dir")
    a = p.parse_args(argv)
    from fairseq import checkpoint_utils

    import fairseq_ext  # noqa: F401  (registers the task and model)

    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [a.checkpoint], arg_overrides={"data": a.data, "tagging_cache_dir": a.cache_dir})
    model = models[0].eval()
    task.load_dataset("test")
    data = task.dataset("test")
    tags, words = task.target_dictionary, task.source_dictionary
    flip = {tags.index("A"): tags.index("B"), tags.index("B"): tags.index("A")}
    rows = []  # (src, prev_output_tokens with y_i as given, i + 1 = the step read)
    for s in range(len(data)):
        item = data[s]
        src, tgt = item["source"], item["target"]  # words + <eos>, labels + <eos>
        for i in range(len(src) - 2):  # F words with a next word
            if not words[int(src[i])].startswith("F"):
                continue
            for consistent in (True, False):
                y = tgt.clone()
                if not consistent:
                    y[i] = flip[int(y[i])]
                prev = torch.cat([torch.tensor([tags.eos()]), y[:-1]])
                rows.append((src, prev, int(y[i]), i + 1, consistent))
    best = {(kind, c): [] for kind in ("raw logit", "log-probability") for c in (True, False)}
    ahead = {key: [] for key in best}
    gap_i = {"raw logit": [], "log-probability": []}  # |f_i(A) - f_i(B)| at the F word
    a_b = [tags.index("A"), tags.index("B")]
    with torch.no_grad():
        for src, prev, label, t, consistent in rows:
            logits = model(src.unsqueeze(0), torch.tensor([len(src)]), prev.unsqueeze(0))[0][0]
            for kind, f in (("raw logit", logits), ("log-probability", torch.log_softmax(logits.float(), -1))):
                best[kind, consistent].append(float(f[t].max()))
                ahead[kind, consistent].append(float(f[t - 1, label] + f[t].max()))
                if consistent:
                    gap_i[kind].append(float((f[t - 1, a_b[0]] - f[t - 1, a_b[1]]).abs()))
    n = len(best["raw logit", True])
    for kind in ("raw logit", "log-probability"):
        c, w = best[kind, True], best[kind, False]
        wins = sum(x > y for x, y in zip(c, w))
        lead = sum(x > y for x, y in zip(ahead[kind, True], ahead[kind, False]))
        print(f"{kind}: |f_i(A) - f_i(B)| at the F word {sum(gap_i[kind]) / n:.3f}; best of step i+1 after "
              f"the consistent prefix {sum(c) / n:.3f}, after the inconsistent {sum(w) / n:.3f}, higher at {100.0 * wins / n:.1f}% of {n} F words; consistent prefix ahead "
              f"after step i+1 at {100.0 * lead / n:.1f}%")


if __name__ == "__main__":
    main()
