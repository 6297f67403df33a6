"""Training with PyTorch: the encoder, its losses, norm heads, calibration.

The only layer besides ``export`` and ``diagnose`` that imports torch or transformers. The
training function is :func:`magretrieve.train.trainer.train`, public as
``magretrieve.train_model``.
"""
