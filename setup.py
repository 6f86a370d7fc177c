"""fairseq-ext: sequence-level training, decoder-aware training and energy-based
sequence models as a fairseq plugin (``--user-dir fairseq_ext``)."""
from setuptools import find_packages, setup

setup(
    name="fairseq-ext",
    version="0.1.0",
    description=__doc__,
    packages=find_packages(include=["fairseq_ext", "fairseq_ext.*"]),
    python_requires=">=3.8",
    install_requires=[
        # fairseq 0.12.2 does not import on Python >= 3.11; fairseq-fixed is
        # upstream main (2023-10) with the Python 3.11 fixes.
        "fairseq-fixed==0.12.3.1; python_version >= '3.11'",
        "fairseq==0.12.2; python_version < '3.11'",
        # No CPU/CUDA build is pinned here: install the torch you want first.
        "torch",
        "sacrebleu>=2,<3",
        "sentencepiece",
        "editdistance",
        "numpy",
    ],
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
