"""Training with PyTorch: the encoder, its losses, norm heads, calibration.

The only layer besides ``export`` and ``diagnose`` that imports torch or transformers.

``magretrieve.train`` is both this folder and the public training function: calling the
package, ``magretrieve.train(model, pairs, config)``, calls
:func:`magretrieve.train.trainer.train`. A package attribute could not serve both, since
importing any ``magretrieve.train.*`` module binds the name ``train`` on ``magretrieve`` to
the package.
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallableTrainPackage(types.ModuleType):
    """This package, callable as the training function it is named after."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from magretrieve.train.trainer import train

        return train(*args, **kwargs)

    @property
    def __wrapped__(self) -> Any:  # inspect.signature and help() show the function's
        from magretrieve.train.trainer import train

        return train


sys.modules[__name__].__class__ = _CallableTrainPackage
