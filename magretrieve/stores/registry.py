"""The store registry: one entry per backend, from which everything store-shaped is derived.

``parse_spec``, ``open_store``, the ``magretrieve index/search/rescale`` store options
and the backend list of the shared store tests are all computed from the entries
registered here, so a new vector store is **its I/O, a typed option class and one line**.

How to add a backend (say ``redis:URL/INDEX``)
----------------------------------------------

1. Write ``magretrieve/stores/redis_store.py`` with a subclass of
   :class:`magretrieve.stores.base.VectorStore` that implements only its I/O:

   - the *primitives* (``_upsert``, ``_query``, ``_delete``, ``_fetch``, ``_existing``,
     ``_count``, ``_scan_ids``, ``_read_meta``/``_write_meta``, ``_describe``), the
     ``dimension`` and ``location`` properties and ``_driver_errors`` (the client library's
     exception classes). The base class checks ids, vectors, payloads, ``k`` and queries,
     computes the norms (``Batch.norms``: store them and return them as
     ``StoreHit.doc_norm``), turns the library's errors into one-line messages with secrets
     masked, and orders results; the primitives receive checked input only;
   - the *lifecycle* hooks ``_exists``, ``_open_existing`` (check the layout and metric,
     return the dimension), ``_create`` and ``_recorded_build``; the constructor calls
     ``self._open_or_create(dimension, what, options.build())``, which opens or creates,
     checks the dimension and the build options on reopen, and creates nothing on a
     read-only open (no dimension). A store over one collection of a database client
     subclasses :class:`~magretrieve.stores.base.CollectionStore` instead, whose
     constructor does all of that (the backend adds its checks in ``_configure``);
   - for an ANN index, ``_recall_knob`` (the search knob ``measure_recall`` tunes to
     ``target_recall``) and ``_keep_recall`` (where the measurement is kept).

   Take the index options as one :class:`~magretrieve.stores.options.IndexOptions` (or its
   keywords: ``IndexOptions.of(options, knobs, where)``). Declare limits as class attributes
   (``max_id_bytes``, ``max_k``), and pass ids and values to the client as bound
   parameters (or escaped literals), never pasted into a query string. Import the client
   library lazily with :func:`~magretrieve.core.extras.require` (its module listed in
   ``core.extras.EXTRAS``) so a missing extra is one clear error and ``import
   magretrieve.stores`` stays cheap.
2. At the bottom of that file, register it::

       register(Backend(
           form="redis:URL/COLLECTION",  # its shape picks the parser (or give parse=)
           open=_open,                   # (location, dimension, **options) -> VectorStore
           options=(HnswOptions, RedisOptions),  # option classes: their keywords and flags
           extra="redis",                # pip install 'magretrieve[redis]'
       ))

   To take a live client in ``open_store`` too, add ``adopts=("redis", "Redis")`` (its
   module and class), ``adopt=RedisStore`` and ``adopted="a redis.Redis client
   (collection=NAME)"``; options that only configure a spec's connection go in
   ``client_options``.

   where ``RedisOptions`` is the backend's own option class, declared beside the entry::

       @dataclass(frozen=True)
       class RedisOptions(StoreOptions):
           password: str | None = option("Redis password.", env="REDIS_PASSWORD")

3. Add the module name to :data:`BACKEND_MODULES` below (the one registry line), the client
   library to an extra in ``pyproject.toml``, and a row to ``docs/stores.md``.

That is all: ``open_store("redis:...")``, spec errors listing the form, ``--hnsw-m`` being
accepted for it on the CLI (and refused for stores that do not take it) follow from the
entry. The shared store tests (``tests/stores/test_stores.py`` and the
injection and secrets suites) run every registered backend; they fail until
``tests/support/store_examples.py`` names an example spec for the new prefix.

Options are declared once, in option classes (those of :mod:`magretrieve.stores.options`
shared by several backends, and a backend's own beside its entry), with their type, bounds
and CLI flag, and checked here before any backend (or native library) sees them, for specs
and adopted objects alike: ``--hnsw-m 0`` is a one-line error, not a SIGABRT inside FAISS.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from magretrieve.core.errors import StoreError
from magretrieve.core.redact import redact, remember_secrets
from magretrieve.stores.options import (
    INDEX_TYPE_HELP,
    AnnotatedOptions,
    IndexOptions,
    StoreOption,
    StoreOptions,
    check_dimension,
)

__all__ = [
    "OPTIONS",
    "Backend",
    "StoreOption",
    "StoreOptions",
    "backends",
    "check_option",
    "open_spec",
    "register",
]

#: Modules that register the built-in backends (imported on first use of the registry).
#: Adding a backend = adding its module here.
BACKEND_MODULES: tuple[str, ...] = (
    "magretrieve.stores.faiss_store",
    "magretrieve.stores.qdrant_store",
    "magretrieve.stores.qdrant_edge_store",
    "magretrieve.stores.memory_store",
    "magretrieve.stores.pgvector_store",
    "magretrieve.stores.milvus_store",
    "magretrieve.stores.chroma_store",
    "magretrieve.stores.lancedb_store",
    "magretrieve.stores.scann_store",
)


# ----------------------------------------------------------------------------- options


#: Every option any registered backend accepts, by keyword: those of the option classes the
#: entries list (``register`` adds them; the CLI flags are derived from this table).
OPTIONS: dict[str, StoreOption] = {
    o.name: o for o in (*IndexOptions.declared(), *AnnotatedOptions.declared())
}


def add_option(option: StoreOption) -> None:
    """Declare an option (``register`` does it for the option classes an entry lists)."""
    known = OPTIONS.setdefault(option.name, option)
    if known != option:
        raise ValueError(f"store option {option.name!r} is already declared differently")


def check_option(name: str, value: Any, where: str = "") -> Any:
    """``value`` checked against the declared option ``name`` (None passes: not given)."""
    return OPTIONS[name].check(value, where, StoreError) if value is not None else None


# ----------------------------------------------------------------------------- backends


@dataclass(frozen=True)
class Backend:
    """One store backend: how its specs look, what it accepts, how it opens.

    - ``form``: the spec form shown in errors and docs (``faiss:DIR``); ``prefix`` is its part
      before ``:``.
    - ``open(location, dimension, **options)``: the store (options already validated).
    - ``parse(rest, spec)``: the part after ``prefix:`` -> location dict (``{"path": ...}``);
      raise StoreError for a malformed spec (the message should show ``form``). By default
      the form's shape picks it (:func:`parse_by_form`: ``DIR``, ``[DIR]``, ``COLLECTION``,
      ``DIR/COLLECTION``, ``URL/COLLECTION``).
    - ``options``: the option classes the backend accepts (all their keywords): shared ones of
      :mod:`.options` and its own; other options are an error.
    - ``index_types``: the index kinds its ``index_type`` takes, for the ``--faiss-index`` help.
    - ``folder``: the location's ``path`` is a directory the store owns (a regular file there
      is refused before anything is encoded).
    - ``persists(location)``: whether what is added outlives the process (``memory:`` does not).
    - ``client_options``: option classes that configure the connection a spec opens (a token,
      a timeout); accepted for adopted clients too, which are connected already, so they are
      dropped before ``adopt``.
    - ``adopts`` / ``adopt(obj, collection, dimension, **options)``: accept a live client or
      index object in ``open_store`` instead of a spec. ``adopts`` recognises it by its class:
      ``(module prefix, class name or "" for any, *attributes it must have)``, e.g.
      ``("pymilvus", "MilvusClient")``; ``adopt`` is usually the store's constructor.
      ``adopted`` names that object for the error listing what ``open_store`` takes; written
      ``"WHAT (collection=WORD)"`` it also makes a missing ``collection=`` an error
      (:func:`open_object` refuses it, one message for every backend). ``adopt_options`` are
      option classes only an adopted object takes. ``adopt`` receives the options checked.
    - ``extra``: the pip extra that installs the backend's library.
    """

    form: str
    open: Callable[..., Any]
    parse: Callable[[str, str], dict[str, str]] = lambda rest, spec: parse_by_form(rest, spec)
    options: tuple[type[StoreOptions], ...] = ()
    client_options: tuple[type[StoreOptions], ...] = ()
    index_types: str | None = None
    folder: bool = False
    persists: Callable[[dict[str, str]], bool] = lambda loc: True
    adopts: tuple[str, ...] | None = None
    adopt: Callable[..., Any] | None = None
    adopted: str | None = None
    adopt_options: tuple[type[StoreOptions], ...] = ()
    extra: str | None = None

    @property
    def prefix(self) -> str:
        """The spec prefix before ``:`` (``faiss``)."""
        return self.form.split(":", 1)[0].lower()

    @property
    def declared(self) -> tuple[StoreOption, ...]:
        """The options the backend accepts (its option classes expanded)."""
        groups = (*self.options, *self.client_options)
        return tuple(o for group in groups for o in group.declared())

    @property
    def adopt_declared(self) -> tuple[StoreOption, ...]:
        """The options only an adopted object takes."""
        return tuple(o for group in self.adopt_options for o in group.declared())

    def adopts_object(self, obj: Any) -> bool:
        """Whether ``obj`` is what the backend adopts (its class's module, name, attributes)."""
        if self.adopts is None:
            return False
        module, name, *attributes = self.adopts
        cls = type(obj)
        return (
            (cls.__module__ or "").startswith(module)
            and (not name or cls.__name__ == name)
            and all(hasattr(obj, a) for a in attributes)
        )

    def check_collection(self, collection: str | None) -> None:
        """Refuse a missing ``collection=`` for an object adopted as ``WHAT (collection=WORD)``."""
        what, given, word = (self.adopted or "").partition(" (collection=")
        if given and not collection:
            raise StoreError(f"{what} needs collection={word.rstrip(')').lower()!r}")

    @property
    def option_names(self) -> tuple[str, ...]:
        """Names of the options the backend accepts."""
        return tuple(o.name for o in self.declared)


_BACKENDS: dict[str, Backend] = {}
_loaded = False


def register(backend: Backend) -> Backend:
    """Add a backend (called at the bottom of its module); the prefix must be new."""
    prefix = backend.prefix.lower()
    if prefix in _BACKENDS and _BACKENDS[prefix] is not backend:
        raise ValueError(f"store prefix {prefix!r} is already registered")
    if (backend.adopts is None) != (backend.adopt is None) or (
        backend.adopts is not None and not backend.adopted
    ):
        raise ValueError(f"{prefix}: adopts, adopt and adopted are given together or not at all")
    if backend.parse is Backend.parse and backend.form.split(":", 1)[-1] not in _PARSERS:
        raise ValueError(f"{prefix}: no parser for the form {backend.form!r}; give parse=")
    for option in backend.declared:
        add_option(option)
    _BACKENDS[prefix] = backend
    return backend


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for module in BACKEND_MODULES:
            importlib.import_module(module)


def backends() -> list[Backend]:
    """Every registered backend, in registration order."""
    _load()
    return list(_BACKENDS.values())


def spec_forms() -> tuple[str, ...]:
    return tuple(b.form for b in backends())


def _not_understood(spec: Any) -> StoreError:
    return StoreError(f"store spec {spec!r} not understood; use one of: {', '.join(spec_forms())}")


def backend_for(spec: str) -> tuple[Backend, dict[str, str]]:
    """The backend a spec names and its parsed location; errors list the accepted forms.

    The spec's credentials are remembered first, so no later message can show them.
    """
    remember_secrets(spec if isinstance(spec, str) else None)
    if not isinstance(spec, str) or ":" not in spec:
        raise _not_understood(spec)
    prefix, rest = spec.split(":", 1)
    _load()
    backend = _BACKENDS.get(prefix.lower())
    if backend is None:
        raise _not_understood(spec)
    return backend, backend.parse(rest, spec)


def check_options(
    backend: Backend, options: dict[str, Any], where: str = "", *, adopting: bool = False
) -> dict[str, Any]:
    """Options with ``None`` dropped, each validated; options the backend does not take refused
    (``adopting``: an adopted object's, which may take the entry's ``adopt_options`` too)."""
    given = {k: v for k, v in options.items() if v is not None}
    remember_secrets(options=given)
    declared = {o.name: o for o in backend.declared}
    if adopting:
        declared.update({o.name: o for o in backend.adopt_declared})
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise StoreError(f"option(s) {unknown} do not apply to {backend.prefix} stores")
    return {k: declared[k].check(v, where, StoreError) for k, v in given.items()}


def check_folder(path: str | Path, spec: str) -> None:
    """Refuse a folder-store location that is a regular file (before anything is encoded)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise StoreError(f"{spec}: {p} is a file, not a folder; a folder store needs a directory")


def open_spec(spec: str, dimension: int | None, options: dict[str, Any]) -> Any:
    backend, loc = backend_for(spec)
    opts = check_options(backend, options, spec)
    if backend.folder and loc.get("path"):
        check_folder(loc["path"], spec)
    if dimension is not None:  # before a backend connects, which may make its files
        check_dimension(dimension, redact(spec))
    return backend.open(loc, dimension, **opts)


def open_object(
    obj: Any, dimension: int | None, collection: str | None, options: dict[str, Any]
) -> Any:
    """The store over a live client or index object a backend adopts, its options checked
    first (one line naming the option at fault, before the object is touched)."""
    for backend in backends():
        if backend.adopt is not None and backend.adopts_object(obj):
            where = type(obj).__name__ + (f" collection {collection!r}" if collection else "")
            opts = check_options(backend, options, where, adopting=True)
            backend.check_collection(collection)
            for option in (o for group in backend.client_options for o in group.declared()):
                opts.pop(option.name, None)  # the adopted client is connected already
            return backend.adopt(obj, collection, dimension, **opts)
    *others, last = ["a VectorStore", *adopted_objects()]
    either = f"{', '.join(others)} or {last}" if others else last
    raise StoreError(
        f"cannot use a {type(obj).__name__} as a store; pass a spec "
        f"({', '.join(spec_forms())}), {either}"
    )


def adopted_objects() -> tuple[str, ...]:
    """What ``open_store`` accepts besides a spec and a VectorStore, one entry per backend."""
    return tuple(b.adopted for b in backends() if b.adopted)


def check_spec_before_encoding(spec: str, *, must_persist: bool = True) -> None:
    """What can be refused about a spec without opening it: form, folder-vs-file, persistence."""
    backend, loc = backend_for(spec)
    if backend.folder and loc.get("path"):
        check_folder(loc["path"], spec)
    if must_persist and not backend.persists(loc):
        raise StoreError(
            f"{spec}: this store keeps nothing after the command ends; "
            f"give a folder (e.g. {backend.prefix}:indexes/NAME) or another store"
        )


def cli_options(search_only: bool = False) -> list[StoreOption]:
    """Options with a CLI flag (only search-time knobs when ``search_only``)."""
    _load()
    used = {name for b in _BACKENDS.values() for name in b.option_names}
    kinds = [f"{b.prefix}: {b.index_types}" for b in _BACKENDS.values() if b.index_types]
    index_type = dataclasses.replace(
        OPTIONS["index_type"], help=f"{INDEX_TYPE_HELP} {'; '.join(kinds)}."
    )
    return [
        index_type if o.name == "index_type" else o
        for o in OPTIONS.values()
        if o.flag is not None and o.name in used and (o.search or not search_only)
    ]


# ----------------------------------------------------------------------------- spec parsers


def parse_dir(rest: str, spec: str) -> dict[str, str]:
    """``prefix:DIR``."""
    if not rest:
        raise _not_understood(spec)
    return {"path": rest}


def parse_optional_dir(rest: str, spec: str) -> dict[str, str]:
    """``prefix:`` or ``prefix:DIR`` (path "" when absent)."""
    return {"path": rest}


def parse_collection(rest: str, spec: str) -> dict[str, str]:
    if not rest:
        raise _missing_collection(spec)
    return {"collection": rest}


def parse_path_collection(rest: str, spec: str) -> dict[str, str]:
    """``prefix:DIR/COLLECTION``."""
    base, _, collection = rest.rstrip("/").rpartition("/")
    if not (base and collection):
        raise _missing_collection(spec)
    return {"path": base, "collection": collection}


def parse_url_collection(rest: str, spec: str) -> dict[str, str]:
    """``prefix:URL/COLLECTION``: the collection is the last path segment after the host."""
    # "http://h:6333" alone has none (rpartition would take "h:6333" for a collection name)
    scheme, sep, after = rest.partition("://")
    host, _, collection = (after if sep else rest).rstrip("/").rpartition("/")
    if host and collection and (sep or ":" in host):
        return {"url": f"{scheme}{sep}{host}", "collection": collection}
    raise _missing_collection(spec)


#: The parsers :func:`parse_by_form` picks, by the shape of the form after ``prefix:``.
_PARSERS: dict[str, Callable[[str, str], dict[str, str]]] = {
    "DIR": parse_dir,
    "[DIR]": parse_optional_dir,
    "COLLECTION": parse_collection,
    "DIR/COLLECTION": parse_path_collection,
    "URL/COLLECTION": parse_url_collection,
}


def parse_by_form(rest: str, spec: str) -> dict[str, str]:
    """The location of a spec, parsed as the shape of its backend's form says."""
    backend = _BACKENDS[spec.split(":", 1)[0].lower()]
    return _PARSERS[backend.form.split(":", 1)[1]](rest, spec)


def _missing_collection(spec: str) -> StoreError:
    prefix = spec.split(":", 1)[0].lower()
    backend = _BACKENDS.get(prefix)
    form = backend.form if backend else spec
    return StoreError(
        f"store spec {spec!r}: missing collection name (expected {form}, e.g. "
        f"{form.replace('COLLECTION', 'scifact')}); use one of: {', '.join(spec_forms())}"
    )
