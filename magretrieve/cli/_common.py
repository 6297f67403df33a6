"""Helpers shared by CLI commands: output formatting, shared options, loading a model.

Commands import shared code from here (or the library), never from each other.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from typing import Any

import click

from magretrieve.cli._options import click_option, click_options
from magretrieve.core.training import TrainConfig


def fmt(value: Any, digits: int = 4) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A plain aligned text table on stdout."""
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)
    ]
    click.echo("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    click.echo("  ".join("-" * w for w in widths))
    for row in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))


def _strict(obj: Any) -> Any:
    """NaN/inf become null: ``json.dumps`` would write the non-standard NaN token."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict(v) for v in obj]
    return obj


def print_json(obj: Any) -> None:
    """One strict JSON document on stdout (undefined numbers as null)."""
    text = json.dumps(obj, default=float)  # numpy scalars → float first
    click.echo(json.dumps(_strict(json.loads(text)), indent=2, allow_nan=False))


def device_option(help_text: str):  # type: ignore[no-untyped-def]
    """``--device cpu|cuda`` (default cpu): the accelerator a command runs on, when present."""
    return click.option(
        "--device",
        type=click.Choice(["cpu", "cuda"]),
        default="cpu",
        show_default=True,
        help=help_text,
    )


def model_option(help_text: str):  # type: ignore[no-untyped-def]
    """``--model`` (required): the model a command loads; what it may be is the command's."""
    return click.option("--model", required=True, help=help_text)


#: ``--k``: neighbours of the hub score (fit-prior, and the hub prior of rescale/annotate).
hub_k_option = click.option(
    "--k", "k", type=int, default=10, show_default=True, help="Neighbours of the hub score."
)

#: ``--store SPEC`` (required): the store a command reads or writes.
store_spec_option = click.option(
    "--store", "store_spec", required=True, help="Store spec, e.g. faiss:indexes/scifact."
)

#: ``--seed``: the random seed of a command that trains (train, diagnose's probe trainings),
#: as :class:`~magretrieve.core.training.TrainConfig` declares it.
seed_option = click_option(TrainConfig.named("seed"))


def magnitude_options(func: Any) -> Any:
    """``--head`` / ``--corpus-prior`` / ``--prior-file`` / ``--k``: where a document's magnitude
    m(d) comes from, for the commands that apply one to stored vectors (rescale, annotate).

    The command receives them as one ``magnitude`` argument: the ``head=`` and ``prior=``
    keywords of ``rescale_store`` and ``annotate_store``.
    """

    @functools.wraps(func)
    def command(
        *args: Any,
        head_dir: str | None,
        beta: float | None,
        prior_file: str | None,
        k: int,
        **kwargs: Any,
    ) -> Any:
        from magretrieve.priors import prior_option

        magnitude = {"head": head_dir, "prior": prior_option(beta, prior_file, k)}
        return func(*args, magnitude=magnitude, **kwargs)

    options = [
        click.option(
            "--head",
            "head_dir",
            type=click.Path(file_okay=False, exists=True),
            default=None,
            help="Run folder of a frozen-encoder norm head (train --norm-head ... "
            "--freeze-encoder).",
        ),
        click.option(
            "--corpus-prior",
            "beta",
            type=float,
            default=None,
            help="β of the corpus-derived hub prior exp(−β·z) (choose it on training queries).",
        ),
        click.option(
            "--prior-file",
            type=click.Path(dir_okay=False, exists=True),
            default=None,
            help="JSON written by `magretrieve fit-prior` instead of --corpus-prior (rescale: "
            "any document prior; annotate: a multiplier-only one such as hub).",
        ),
        hub_k_option,
    ]
    for option in reversed(options):
        command = option(command)
    return command


def print_magnitude_report(
    report: Any, as_json: bool, headline: str, extra: dict[str, Any] | None = None
) -> None:
    """A rescale's or an annotation's report: JSON, or ``headline`` and a table of the
    magnitude's kind and range (plus the ``extra`` columns)."""
    if as_json:
        print_json(report.to_dict())
        return
    click.echo(headline)
    extra = extra or {}
    print_table(
        ["magnitude", "min", "mean", "max", *extra],
        [
            (
                report.kind,
                report.magnitude_min,
                report.magnitude_mean,
                report.magnitude_max,
                *extra.values(),
            )
        ],
    )


def store_options(fn):  # type: ignore[no-untyped-def]
    """The store options of every registered backend (magretrieve/stores/registry.py), as click options.

    Build-time knobs shape a store when it is created; on reopen they must match what the
    store was built with (or the store refuses them). Each backend refuses options it does
    not take, naming them.
    """
    from magretrieve.stores.registry import cli_options

    return click_options(cli_options())(fn)


def search_store_options(fn):  # type: ignore[no-untyped-def]
    """The search-time store knobs (``--ef-search``, ``--nprobe``, ...) for ``search``."""
    from magretrieve.stores.registry import cli_options

    return click_options(cli_options(search_only=True))(fn)


def collect_store_options(**kw: Any) -> dict[str, Any]:
    """The store options the user gave (unset click options arrive as None)."""
    return {k: v for k, v in kw.items() if v is not None}


#: What a PyTorch model needs: the modules of the ``train`` extra that load and run it.
TORCH_MODULES = ("torch", "transformers")


def require_torch(what: str, hint: str | None = None) -> None:
    """Refuse ``what`` in one line naming ``pip install 'magretrieve[train]'`` when PyTorch is
    missing (a serving install), before any work is done."""
    from magretrieve.core.extras import require_all

    require_all(TORCH_MODULES, what=what, extra="train", hint=hint)


def require_store_extra(spec: str) -> None:
    """Refuse a store spec whose backend's extra is not installed, before any work is done
    (a command that reads one store and then writes another would otherwise read first)."""
    from magretrieve.core.extras import EXTRAS, require_all
    from magretrieve.stores.registry import backend_for

    backend, _ = backend_for(spec)
    if backend.extra:
        require_all([module for module, (_, extra) in EXTRAS.items() if extra == backend.extra])


def load_model(model: str, mode: str | None, device: str = "cpu") -> Any:
    """An ONNX export folder loads with the runtime; anything else with the torch encoder."""
    from pathlib import Path

    if (Path(model) / "magretrieve.json").is_file():
        from magretrieve.core.errors import ConfigError
        from magretrieve.serving.onnx_encoder import OnnxEncoder

        encoder = OnnxEncoder.load(model, device=device)
        if mode is not None and mode != encoder.manifest.mode:
            raise ConfigError(
                f"{model}: an export is fixed to mode {encoder.manifest.mode!r}; re-export for {mode!r}"
            )
        return encoder
    require_torch(
        f"--model {model} (not an ONNX export, so a PyTorch model)",
        hint="an export folder (magretrieve export) runs without them",
    )
    from magretrieve.train.encoder import Encoder

    return Encoder.load(model, mode, device=device)
