"""Tiny fairseq models for the designed tasks: one small configuration per architecture
the plugin supports (``TINY_ARCHS``, command-line style) and ``build_task_and_model``, which
builds a fairseq task and model from such arguments in-process, as ``fairseq-train`` would.
A method can be tried on a synthetic task in seconds with them; the tests and benchmarks
use them."""


TINY_ARCHS = {
    "transformer": ["--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1",
                    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
                    "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
                    "--decoder-attention-heads", "2"],
    "lstm": ["--arch", "lstm", "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16",
             "--decoder-embed-dim", "16", "--encoder-hidden-size", "16", "--decoder-hidden-size", "16",
             "--decoder-out-embed-dim", "16"],
    "tagging_lstm": ["--arch", "tagging_lstm_tiny"],
    # conditional masked LM (Mask-Predict); its task is translation_lev / translation_mh
    "cmlm_transformer": ["--arch", "cmlm_transformer", "--encoder-layers", "1", "--decoder-layers", "1",
                         "--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
                         "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
                         "--decoder-attention-heads", "2", "--share-all-embeddings", "--noise", "random_mask"],
    "transformer_lm": ["--arch", "transformer_lm", "--decoder-layers", "1", "--decoder-embed-dim", "16",
                       "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2"],
    "lstm_lm": ["--arch", "lstm_lm", "--decoder-layers", "1", "--decoder-embed-dim", "16", "--decoder-hidden-size", "16",
                "--decoder-out-embed-dim", "16"],
}


def build_task_and_model(data_dir: str, task: str, arch: str, extra=(), seed: int = 1):
    """Build a fairseq task and a tiny model (``TINY_ARCHS``) from CLI-style args,
    as ``fairseq-train`` would; returns ``(task, model, args)``."""
    import torch
    from fairseq import options, tasks

    import fairseq_ext  # noqa: F401  (registers the project's tasks)

    torch.manual_seed(seed)
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, [data_dir, "--task", task, "--seed", str(seed), "--dropout", "0.1"] + TINY_ARCHS[arch] + list(extra)
    )
    fairseq_task = tasks.setup_task(args)
    model = fairseq_task.build_model(args)
    return fairseq_task, model, args
