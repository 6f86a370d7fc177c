"""Energies per second of a residual energy model (``residual_energy``, ``bit``)
scoring the n base-LM samples of Algorithm 1 in batches (``--residual-energy-batch-size``,
as the joint sampler and eval_residual.py do) against one sequence at a time,
both timed in the same run (interleaved, median), and their ratio.

Run: ``.venv/bin/python bench/bench_residual.py`` (under a minute on one CPU core;
``--quick`` for a smoke run, ``--json FILE`` to keep the rows).

Model (eval mode, random weights): a bidirectional transformer encoder, 2 layers,
dim 256, ffn 1024, 4 heads (``--quick``: 1 layer, dim 16) over a 1000-word
vocabulary; N random sequences of p + L = 24 + 8 tokens (the task's CPU default).

Joint sampling (Algorithm 1, ``JointSampler.generate``): ms per prefix for n = 100
and n = 1000 proposals (``--quick``: 10 and 100), with a ``transformer_lm`` base
LM of the same size (2 layers, dim 256; random weights), L = 8, no top-k, one
prefix of 24 tokens, median of ``--repeats``: the cost a user pays per output.
"""
import argparse
import json
import logging

for _name in ("fairseq", "fairseq_cli"):
    logging.getLogger(_name).setLevel(logging.WARNING)

import torch
from fairseq.data import Dictionary

from fairseq_ext.generators.joint_sampler import JointSampler, energies_in_batches
from fairseq_ext.models.residual_energy import ResidualEnergyConfig, ResidualEnergyModel

import timing  # bench/timing.py, beside this script


class _Task:
    def __init__(self, dictionary: Dictionary):
        self.source_dictionary = dictionary


def build_model(quick: bool, vocab: int = 1000) -> ResidualEnergyModel:
    d = Dictionary()
    for i in range(vocab):
        d.add_symbol(f"w{i}")
    cfg = ResidualEnergyConfig(energy_variant="bit", encoder_layers=1 if quick else 2,
                               encoder_embed_dim=16 if quick else 256, encoder_ffn_embed_dim=32 if quick else 1024,
                               encoder_attention_heads=2 if quick else 4, dropout=0.0)
    return ResidualEnergyModel.build_model(cfg, _Task(d)).eval()


def build_base_lm(quick: bool, dictionary: Dictionary):
    from fairseq.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig
    from omegaconf import OmegaConf

    dim = 16 if quick else 256
    cfg = OmegaConf.structured(TransformerLanguageModelConfig(
        decoder_layers=1 if quick else 2, decoder_embed_dim=dim, decoder_input_dim=dim, decoder_output_dim=dim,
        decoder_ffn_embed_dim=4 * dim, decoder_attention_heads=2 if quick else 4, tokens_per_sample=64,
        max_target_positions=64))
    task = _Task(dictionary)
    task.target_dictionary = dictionary
    return TransformerLanguageModel.build_model(cfg, task).eval()


def joint_sampling_rows(model, quick: bool, repeats: int, energy_batch_size: int, prefix_len: int = 24):
    """ms per prefix of Algorithm 1 for n = 100 and 1000 (quick: 10 and 100)."""
    lm = build_base_lm(quick, model.body.dictionary)
    sample = {"id": torch.tensor([0]), "net_input": {
        "src_tokens": torch.randint(4, len(model.body.dictionary), (1, prefix_len))}}
    fns = {}
    for n in ((10, 100) if quick else (100, 1000)):
        sampler = JointSampler(lm, 8, n, energy_batch_size=energy_batch_size)
        fns[f"joint sampling n={n}"] = (lambda s: lambda: s.generate([model], sample))(sampler)
    ms, _ = timing.interleaved(fns, 1, repeats, torch.device("cpu"))
    return [{"row": name, "ms": ms[name], "ms_per_prefix": ms[name]} for name in fns]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-sequences", type=int, default=256, help="N sequences (e.g. 16 prefixes x n = 16)")
    p.add_argument("--energy-batch-size", type=int, default=64)
    p.add_argument("--length", type=int, default=32)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="tiny model, 32 sequences, 1 repeat (smoke test)")
    p.add_argument("--json", help="write the rows to this file")
    a = p.parse_args(argv)
    if a.quick:
        a.num_sequences, a.repeats = 32, 1
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = build_model(a.quick)
    seqs = torch.randint(4, len(model.body.dictionary), (a.num_sequences, a.length))
    device = torch.device("cpu")

    @torch.no_grad()
    def batched():
        return energies_in_batches(model, seqs, a.energy_batch_size)

    @torch.no_grad()
    def one_at_a_time():
        return energies_in_batches(model, seqs, 1)

    ms, last = timing.interleaved({"batched": batched, "one at a time": one_at_a_time}, a.warmup, a.repeats, device)
    # the same energies either way (padding-free sequences, eval mode)
    assert torch.allclose(last["batched"], last["one at a time"], atol=1e-4)
    rows = [{"row": name, "ms": ms[name], "energies_per_s": a.num_sequences / (ms[name] / 1000),
             "ratio_to_one_at_a_time": ms["one at a time"] / ms[name]} for name in ("batched", "one at a time")]
    print(f"residual_energy bit, {a.num_sequences} sequences of {a.length} tokens, energy batch "
          f"{a.energy_batch_size}, {a.threads} thread(s), median of {a.repeats}")
    print(timing.table(["row", "ms", "energies/s", "speed-up"],
                       [[r["row"], f"{r['ms']:.1f}", f"{r['energies_per_s']:.0f}", f"{r['ratio_to_one_at_a_time']:.2f}"]
                        for r in rows]))
    joint = joint_sampling_rows(model, a.quick, a.repeats, a.energy_batch_size)
    print(f"\njoint sampling (Algorithm 1), one prefix of 24 tokens, L = 8, no top-k, base LM and energy as above")
    print(timing.table(["row", "ms / prefix"], [[r["row"], f"{r['ms']:.1f}"] for r in joint]))
    rows += joint
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
