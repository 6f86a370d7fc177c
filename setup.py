"""fairseq-ext: sequence-level training, decoder-aware training and energy-based
sequence models as a fairseq plugin (``--user-dir "$(fairseq-ext-dir)"``)."""
from setuptools import find_packages, setup

setup(
    name="fairseq-ext",
    version="0.1.0",
    description=__doc__,
    packages=find_packages(include=["fairseq_ext", "fairseq_ext.*"]),
    python_requires=">=3.8",
    # torch and fairseq are not named: the user's own (a CUDA build of torch; fairseq 0.12.2,
    # fairseq-fixed, a source checkout or a fork, which are different distributions of one
    # module) stay as they are. Importing the plugin checks their versions and names the
    # supported ones (fairseq_ext/runtime/support.py); `make install` installs a working set.
    install_requires=[
        "sacrebleu>=2,<3",
        "sentencepiece",
        "editdistance",
        "numpy",
    ],
    # fairseq-ext-dir prints the package's directory for --user-dir; a script, not an entry
    # point, so that it answers without importing the package (torch, fairseq)
    scripts=["bin/fairseq-ext-dir"],
    extras_require={
        # the paper-scale recipes (examples/*/run.sh): Moses tokenization and subword-nmt BPE
        "recipes": ["sacremoses", "subword-nmt"],
        # matplotlib and tensorboardX too, so that every figure and --tensorboard-logdir are tested
        "test": ["pytest", "pytest-xdist", "hypothesis", "sacremoses", "subword-nmt", "matplotlib", "tensorboardX"],
        "plot": ["matplotlib"],
        # fairseq-train --tensorboard-logdir (fairseq falls back to tensorboardX without tensorboard)
        "tensorboard": ["tensorboardX"],
    },
)
