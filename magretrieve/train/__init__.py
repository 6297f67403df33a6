"""Training with PyTorch: the encoder, its losses, norm heads, calibration.

The only layer besides ``export`` and ``diagnose`` that imports torch or transformers. The
training function is :func:`magretrieve.train.trainer.train`, public as
``magretrieve.train_model``. Without the ``train`` extra, importing any module of this layer
(and so ``magretrieve train``, ``eval``, ``export`` and ``diagnose``) is one
:class:`~magretrieve.core.extras.MissingExtra` naming it.
"""

from magretrieve.core.extras import require

# torch first: transformers imported without torch logs a warning of its own
require("torch", what="PyTorch training", extra="train")
require("transformers", what="PyTorch training", extra="train")
