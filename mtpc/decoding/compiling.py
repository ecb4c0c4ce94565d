"""`torch.compile` of one cycle step (a decoder's verify step or its acceptance-and-draft step, a plain step),
the same way for every step.

A step is a pure function of fixed-shape tensors (randomness comes in as uniforms, positions as a
tensor), so it compiles once per shape, but for one dimension left dynamic on purpose: the number of cache
slots a call attends over grows cycle by cycle (`dynamic_length`), and one graph serves every length. It
compiles inductor on the CPU (with its C++ wrapper: at batch 1 the
Python wrapper's per-call cost is a visible part of a step); on CUDA `mode="reduce-overhead"`, i.e.
CUDA graphs, whose outputs live in memory the next replay overwrites, so they are copied out.

On the CPU the decoder's cycle steps are compiled ahead of time (`precompiled_step`) and kept on disk:
inductor's own cache keeps the kernels between processes, but dynamo would trace the step again in
every process (2-3 s of a `mtpc generate --compile` run), so the traced step, its guards and its
kernels are saved together and a later process loads them instead (with a torch that has `aot_compile`;
an older one, 2.11 say, traces the step in every process).

Loading a stored step unpickles it, so a store is used only under `mtpc.step_store`'s trust rules; a store
that fails is skipped with a warning and the step traced afresh.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import io
import logging
import sys
from dataclasses import dataclass, fields, is_dataclass, replace
from functools import cache, partial
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..step_store import UntrustedStore, check_store, read_stored_step, step_store

__all__ = ["CPU_OPTIONS", "CompiledStep", "PlainVariant", "StepVariant", "StepVariants", "VerifyVariant",
           "Undescribable", "compile_step", "derived_identity", "described", "module_configuration",
           "dynamic_length", "isolation_options",
           "precompiled_step", "savable_guards", "steps_can_be_stored", "tensor_layout"]

log = logging.getLogger(__name__)


# Each compiled step keeps its own variants (`isolate_recompiles`): by default dynamo files every variant of
# a code object in one list, checks their guards in turn on every call and stops compiling at 8, so the
# decoders of a bench (one `decide_step` code object, a few variants each) would fall back to eager.
RECOMPILE_LIMIT = 64


def isolation_options(compile_parameters) -> dict:
    """`torch.compile`'s options for one step, given the names of the parameters it takes. A torch whose
    `torch.compile` has no `isolate_recompiles` (2.11 has not) gets none: its steps share dynamo's list and
    limit, which `compile_step` raises around each call instead."""
    if "isolate_recompiles" in compile_parameters:
        return {"dynamic": False, "isolate_recompiles": True, "recompile_limit": RECOMPILE_LIMIT}
    return {"dynamic": False}


ISOLATED = isolation_options(inspect.signature(torch.compile).parameters)

# Inductor options on a CPU. `cpp_wrapper`: a C++ wrapper around the kernels (measured 0.14-0.20 ms a call
# where the Python one took 0.21-0.31; on SmolLM2's 30 layers a verify call took 10% longer through the Python
# wrapper). `cpp_wrapper_build_separate`: the wrapper is built at -O1 and the kernels apart at -O3, where one
# -O3 build of both took 97 of the 157 s a cold SmolLM2 step compiled in (now 62 s; its cycles ran 1.5%
# slower, within the spread of the rounds). `cpp.vec_isa_ok`: inductor otherwise proves, in every process, that
# the C++ compiler builds and loads code for each vector ISA the CPU reports, one child Python per check
# (three on our CPU, a few tenths of a second each, in every `mtpc generate --compile`). The ISAs it
# would check are the CPU's own (read from cpuinfo either way), and any g++ or clang of the last several
# years builds for them; the narrower checks (AVX-512 VNNI and bf16, AMX) still run.
CPU_OPTIONS = {"cpp_wrapper": True, "cpp_wrapper_build_separate": True, "cpp.vec_isa_ok": True}


def compile_step(step: Callable, cuda: bool) -> Callable:
    """`step` compiled for fixed shapes (`dynamic=False`), with its own cache of compiled variants; on CUDA
    its tensor outputs are cloned."""
    mode = {"mode": "reduce-overhead"} if cuda else {"options": CPU_OPTIONS}
    compiled = torch.compile(step, **mode, **ISOLATED)
    if "isolate_recompiles" not in ISOLATED:
        compiled = with_recompile_limit(compiled)
    if not cuda:
        return compiled

    def call(*args):
        return copied(compiled(*args))

    return call


def with_recompile_limit(compiled: Callable) -> Callable:
    """`compiled` called with dynamo's recompile limit raised to `RECOMPILE_LIMIT` (for a torch without
    `isolate_recompiles`). The patch is built once and entered on every call: about 5 us a call on torch
    2.11 on our CPU, where a patch built per call took 20, against a compiled step's milliseconds."""
    raised = torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT)

    def call(*args):
        with raised:
            return compiled(*args)

    return call


def copied(out):
    """A step's outputs (a tensor, None, or tuples of them) with every tensor cloned."""
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, tuple):
        return tuple(copied(x) for x in out)
    return out


def dynamic_length(t: torch.Tensor) -> torch.Tensor:
    """`t` with its first dimension marked dynamic: the compiled step traced on it keeps that length symbolic
    (one graph for every length, where `dynamic=False` would compile one per length)."""
    torch._dynamo.mark_dynamic(t, 0)
    return t


class CompiledStep:
    """A step compiled for its owner: `aot`, compiled ahead of time (`precompiled_step`), or `traced`, a
    `torch.compile`d callable. Calling it checks the compiled graph's guards on every call (the shapes,
    dtypes and strides of the arguments and of the owner's tensors, the constants the trace read: for the
    decoder's step on a CPU about 0.1-0.2 ms, 5% of a compiled cycle). `checked(*args)` checks them once,
    for a run of calls whose inputs all have the shapes and constants of `args` (the cycles of one
    generation): the step without the per-call check, or None when they fail (a `traced` step checks its
    own on every call and compiles again on a miss, so it comes back as it is)."""

    def __init__(self, owner, aot=None, traced: Callable | None = None):
        self.owner, self.aot, self.traced = owner, aot, traced

    def __call__(self, *args):
        return self.traced(*args) if self.aot is None else self.aot(self.owner, *args)

    def checked(self, *args) -> Callable | None:
        if self.aot is None:
            return self.traced
        if not self.aot.guard_check(self.owner, *args):
            return None
        return partial(self.aot.fn, self.owner)


@cache  # a fact of the torch installed; asked only when compiling (the first torch.compile imports dynamo)
def steps_can_be_stored() -> bool:
    """Whether this torch compiles a step ahead of time (`aot_compile`; 2.11 does not): else `precompiled_step`
    compiles every step for its process only, as `compile_step` does."""
    return hasattr(torch.compile(lambda x: x), "aot_compile")


def precompiled_step(step: Callable, args: tuple, identity: str | None, dynamic: Sequence[torch.Tensor] = (),
                     store: Path | None = None, label: str = "a step", savable: bool = True) -> CompiledStep:
    """`step` (a bound method: a pure step of fixed-shape tensors, one graph) compiled ahead of time on
    the CPU for calls like `step(*args)`, loaded from `store` (default `step_store()`) when an earlier
    process saved it, else compiled there and saved. `identity` names everything the traced step depends
    on besides the library's source and torch, transformers, kernels, peft and Python versions (which the
    file name hashes as well) and what its guards check on every call (the arguments' shapes, dtypes and the
    constants it read): the model's and the head's configurations and weights' shapes and dtypes, the
    variant; None when the step runs code none of those name (a user's own model class, say): it is then
    compiled for this process only. `dynamic`: tensors of `args` whose first dimension the compiled step leaves symbolic
    (`dynamic_length`; marked only to compile: a loaded step's guards refuse marked tensors). A stored step
    that cannot be read, or whose guards refuse `args`, is compiled again and replaced; a step whose guards
    torch cannot save is compiled by `compile_step` (traced again in each process). A store others could
    have written (`check_store`, `read_stored_step`) is neither read nor written: a warning, and the step
    is compiled for this process. A step about to be compiled (not loaded) is announced first, by `label`.
    `savable=False`: a step whose guards torch is known not to save (one running `torch.func.vmap`) is compiled
    by `compile_step` straight away, where an attempt to compile it ahead of time would trace it twice."""
    owner, function = step.__self__, step.__func__
    storable = savable and steps_can_be_stored()
    path = None
    folder = None if identity is None or not storable else _trusted_store(store or step_store())
    if folder is not None:  # its real path, checked: what is opened is what was judged
        path = folder / f"{_step_key(function, identity)}.bin"
    compiled = None if path is None else _load(path, function, owner, args)
    if compiled is not None:
        return CompiledStep(owner, aot=compiled)
    for tensor in dynamic:
        dynamic_length(tensor)
    # torch 2.13 cannot save some steps' guards beyond those known (`savable`): those are traced in every
    # process, as every step was before, and a marker file says so
    unsaved = None if path is None else path.with_suffix(".unsaved")
    announce_compiling(label, stored=storable and unsaved is not None and not unsaved.exists())
    if storable and (unsaved is None or not unsaved.exists()):
        try:
            options = {**CPU_OPTIONS, "guard_filter_fn": savable_guards}
            compiled = torch.compile(function, fullgraph=True, dynamic=False, options=options).aot_compile(
                ((owner, *args), {}))
        except (torch._dynamo.exc.PackageError, TypeError):  # a guard torch cannot save: the same next time
            _save(None, unsaved)
        except Exception:  # noqa: BLE001 -- an experimental API: anything else it raises, the step compiles as before
            pass
    if compiled is None:
        return CompiledStep(owner, traced=compile_step(step, cuda=False))
    _save(compiled, path)
    return CompiledStep(owner, aot=compiled)


@dataclass(frozen=True)
class StepVariant:
    """What one compiled variant of a decoder's acceptance-and-draft step specialises on: the sampling (a
    constant of the trace), the number of EOS ids, the cache allocation it writes (new tensors after every
    allocation), the verify width and the batch size."""

    sampling: object
    eos_count: int
    allocation: int
    width: int
    batch: int

    def label(self) -> str:
        return (f"the {'greedy' if self.sampling.greedy else 'sampling'} acceptance and draft after a verify over "
                f"{_count(self.width, 'position')} for {_count(self.batch, 'row')} (seconds for a chain; a tree's "
                "draft, unrolled node by node, about a minute on a CPU)")


@dataclass(frozen=True)
class VerifyVariant:
    """What one compiled variant of a decoder's verify step (the model's call over a window) specialises on: the
    cache allocation it writes, the verify width and the batch size; not the sampling, so greedy and sampling
    cycles share it."""

    allocation: int
    width: int
    batch: int

    def label(self) -> str:
        return (f"the model's verify call over {_count(self.width, 'position')} for {_count(self.batch, 'row')} "
                "(the whole model as one graph: seconds for a small model, about a minute for a 30-layer one on a "
                "CPU; greedy and sampling cycles share it)")


@dataclass(frozen=True)
class PlainVariant:
    """What one compiled variant of a plain decoder's one-token step specialises on: the cache allocation it
    writes and the batch size."""

    allocation: int
    batch: int

    def label(self) -> str:
        return (f"the plain decoding step for {_count(self.batch, 'row')} (the whole model as one graph: seconds "
                "for a small model, about a minute for a 30-layer one on a CPU)")


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


class StepVariants:
    """A decoder's compiled steps of one kind (its verify step, or its acceptance-and-draft step): each variant
    (`StepVariant`, `VerifyVariant`, `PlainVariant`) compiled once per process (on the CPU loaded from
    `step_store()` when an earlier process saved it), made ready before a generation's first cycle
    (`make_ready`: its guards checked once for the generation's shapes), and handed out per cycle
    (`step_for`: the ready step, else the eager `step`: a cycle never compiles).

    `step`: the decoder's eager cycle step (a bound method); `identity(variant, layout)`: what a stored step
    depends on besides its guards (see `precompiled_step`), None to keep it in this process only;
    `savable(variant)` (default: always): False for a variant torch cannot save (`precompiled_step`'s
    `savable`). A pickled copy is empty (the compiled steps belong to the process)."""

    def __init__(self, step: Callable, identity: Callable, savable: Callable | None = None):
        self.step, self.identity, self.savable = step, identity, savable
        self.compiled: dict[tuple, CompiledStep] = {}  # (variant, tensor layout) -> compiled step
        self.ready: dict[StepVariant, Callable] = {}  # this generation's variants, guards checked
        self.fresh = 0  # variants this generation compiled (or loaded from the store)

    def __reduce__(self):
        return StepVariants, (self.step, self.identity, self.savable)

    def start(self) -> None:
        """A new generation: every variant's guards are checked again (`make_ready`)."""
        self.ready.clear()
        self.fresh = 0

    def make_ready(self, variant, layout: tuple, args: tuple, dynamic: Sequence[torch.Tensor]) -> None:
        """Ready `variant` for calls like `step(*args)` (`dynamic`: tensors of `args` whose first dimension
        varies from cycle to cycle): compiled now unless this process compiled it for the same `layout` (the
        model's and head's tensors, `tensor_layout`), and its guards checked once."""
        compiled = self.compiled.get((variant, layout))
        ready = None if compiled is None else compiled.checked(*args)
        if ready is None:  # not compiled yet, or its guards refuse (a constant it read changed since)
            self.compiled[variant, layout] = compiled = self._compile(variant, layout, args, dynamic)
            self.fresh += 1
            # a step is not refused by its own arguments; if it were, it would run with its guards
            ready = compiled.checked(*args) or compiled
        self.ready[variant] = ready

    def step_for(self, variant) -> Callable:
        return self.ready.get(variant, self.step)

    def _compile(self, variant, layout: tuple, args: tuple, dynamic: Sequence[torch.Tensor]) -> CompiledStep:
        # eagerly first: the circuit's draft program builds its plans on first use, and a trace that saw them
        # built would be recompiled on the next call
        self.step(*args)
        label = variant.label()
        if any(isinstance(arg, torch.Tensor) and arg.is_cuda for arg in args):
            announce_compiling(label, stored=False)
            for tensor in dynamic:
                dynamic_length(tensor)
            step = CompiledStep(self.step.__self__, traced=compile_step(self.step, cuda=True))
        else:
            savable = self.savable is None or self.savable(variant)
            step = precompiled_step(self.step, args, self.identity(variant, layout), dynamic=dynamic, label=label,
                                    savable=savable)
        step(*args)
        return step


def announce_compiling(label: str, stored: bool) -> None:
    """One line before a step compiles: a first compile of the verify step traces the whole model as one graph
    (about a minute for a 30-layer model on a CPU), which nothing printed before this line said."""
    later = ("kept in the step store if torch can save it: later processes load it in seconds" if stored else
             "for this process only: another traces it again, faster once inductor's cache holds its kernels")
    log.warning("mtpc: compiling %s; %s", label, later)


KNOWN_CODE = ("mtpc.", "circuitc.", "transformers.", "peft.", "torch.")  # code a stored step's key follows
MAX_DESCRIBED_DEPTH = 32


class Undescribable(Exception):
    """A value a compiled step's key cannot describe: an object of a class outside mtpc, circuitc, transformers,
    peft and torch (a user's acceptance rule or model family, a model's remote code), whose code could change
    without the key noticing."""


def derived_identity(variant, layout: tuple, *values) -> str | None:
    """A compiled step's identity (see `precompiled_step`), derived from what the step closes over: `values`
    (a decoder's `CycleSettings`, its model, family and head, its caches' length), the tensors' `layout`
    (`tensor_layout`) and the variant less its allocation (which only tells this process's caches apart).
    Everything is described whole (`described`), so a setting added to any of them is in the key. None when
    a value cannot be described: the step is then kept in this process only."""
    try:
        return repr(described((values, layout, replace(variant, allocation=0))))
    except Undescribable:
        return None


def described(value, depth: int = 0):
    """`value` as plain data for a compiled step's key: None, numbers and strings as they are; dtypes and devices
    by name; a tensor by its shape, dtype and device (its values are the step's inputs, not constants); tuples,
    lists, dicts and sets item by item; a dataclass by its class and every field; a module by its class and
    its configuration (a transformers model's `config`, a head's `config()`: its graph, options, dtype and
    vocabulary; every submodule's class known); any other object by its class and attributes. `Undescribable`
    for an object of a class outside `KNOWN_CODE`, a head that cannot describe itself, or data nested deeper than
    `MAX_DESCRIBED_DEPTH`."""
    if depth > MAX_DESCRIBED_DEPTH:
        raise Undescribable(f"nested deeper than {MAX_DESCRIBED_DEPTH}")
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if isinstance(value, (torch.dtype, torch.device)):
        return str(value)
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), str(value.dtype), str(value.device))
    if isinstance(value, (tuple, list)):
        return tuple(described(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return tuple(sorted((repr(key), described(item, depth + 1)) for key, item in value.items()))
    if isinstance(value, (set, frozenset)):
        return tuple(sorted(repr(described(item, depth + 1)) for item in value))
    kind = type(value)
    if not kind.__module__.startswith(KNOWN_CODE):
        raise Undescribable(f"{kind.__module__}.{kind.__qualname__}")
    name = f"{kind.__module__}.{kind.__qualname__}"
    if is_dataclass(value):
        return name, tuple((f.name, described(getattr(value, f.name), depth + 1)) for f in fields(value))
    if isinstance(value, torch.nn.Module):
        foreign = [m for m in value.modules() if not type(m).__module__.startswith(KNOWN_CODE)]
        if foreign:  # a user's layer inside a known model: its code is not in the key either
            raise Undescribable(f"{type(foreign[0]).__module__}.{type(foreign[0]).__qualname__}")
        return name, described(module_configuration(value), depth + 1)
    return name, described(vars(value), depth + 1)


def module_configuration(module: torch.nn.Module):
    """A module's configuration as a key holds it: a transformers model's `config` less the folder it came
    from, a head's `config()`; None for a module without one."""
    config = getattr(module, "config", None)
    if callable(config):
        try:
            config = config()
        except ValueError as e:  # a head whose circuit keeps no graph cannot describe itself
            raise Undescribable(str(e)) from None
    if hasattr(config, "to_dict"):
        config = {key: item for key, item in config.to_dict().items() if key != "_name_or_path"}
    return config


def tensor_layout(*modules: torch.nn.Module) -> tuple:
    """The name, shape, dtype and device of every parameter and buffer of `modules`: what a compiled step
    also specialises on, and its guards (as torch saves them) do not check."""
    tensors = [item for module in modules for item in (*module.named_parameters(), *module.named_buffers())]
    return tuple((name, tuple(t.shape), t.dtype, t.device) for name, t in tensors)


def savable_guards(guards: Sequence) -> list[bool]:
    """Which guards a saved step keeps (`torch.compile`'s `guard_filter_fn`): those torch keeps by default
    (it drops guards on globals, on object identity and on closures), less two kinds it can neither save
    nor rebuild: type checks on function wrappers of classes made in a function, and guards on what a
    closure holds other than tensors (a tensor's guards stay: a step whose saved guards cannot be rebuilt
    fails to load and is compiled again). transformers 5.25 with the `kernels` package turns functions
    such as Llama's rotary embedding into such wrappers (`kernels`' `use_kernelized_func`, one per
    attention layer), whose `forward` calls the function through its closure. A wrapper holds no tensors,
    and the file name hashes the transformers and kernels versions that made it."""
    from torch._dynamo.guards import CheckFunctionManager

    unsavable = CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES
    return [not (guard.is_global or guard.guard_type in unsavable or _in_closure(guard)
                 or guard.guard_type == "TYPE_MATCH" and guard.has_value and _stateless_local_module(guard.value))
            for guard in guards]


def _in_closure(guard) -> bool:
    """`guard` checks something other than a tensor that its step reads through a function's closure."""
    return "__closure__" in guard.name and not (guard.has_value and isinstance(guard.value, torch.Tensor))


def _stateless_local_module(value) -> bool:
    """`value` is a `torch.nn.Module` without parameters or buffers whose class was made in a function."""
    kind = type(value)
    return (isinstance(value, torch.nn.Module) and kind.__qualname__ != kind.__name__
            and next(value.parameters(), None) is None and next(value.buffers(), None) is None)


def _save(compiled, path: Path | None) -> None:
    """Save `compiled` at `path` (None: an empty marker file; no `path`: nothing to save), in a store this
    process would read back (`check_store` once the folder is made: another user may have made it first)."""
    if path is None:
        return
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        check_store(path.parent)
        if compiled is None:
            path.touch()
        else:
            compiled.save_compiled_function(str(path))  # written to a temporary file, then renamed
    except UntrustedStore as e:
        _warn(e)
    except OSError:  # a read-only cache: this process still has its step
        pass


def _load(path: Path, function: Callable, owner, args: tuple):
    """The step stored at `path` if this user wrote it and no one else could have (`read_stored_step`), it
    loads and its guards accept `(owner, *args)`, else None. Loading unpickles the bytes that were checked,
    never the file again."""
    try:
        data = read_stored_step(path)
    except UntrustedStore as e:
        _warn(e)
        return None
    except OSError as e:  # a file that opened but cannot be read: the store never ends a run
        _warn(UntrustedStore(f"{path} cannot be read ({e.strerror or e})"))
        return None
    if data is None:
        return None
    import torch._inductor.config as inductor_config

    try:
        with inductor_config.patch(CPU_OPTIONS):
            scope = sys.modules[function.__module__].__dict__  # the globals the step's code reads
            compiled = torch.compiler.load_compiled_function(io.BytesIO(data), f_globals=scope)
        return compiled if compiled.guard_check(owner, *args) else None
    except Exception:  # noqa: BLE001 -- a stale or damaged file, whatever torch raises for it: compile afresh
        return None


def _trusted_store(folder: Path) -> Path | None:
    """The real path of `folder` if steps may be read from and saved in it (`check_store`), else None and
    a warning."""
    try:
        return check_store(folder)
    except UntrustedStore as e:
        _warn(e)
        return None


_warned: set[str] = set()


def _warn(problem: UntrustedStore) -> None:
    """One warning per problem and process (a bench compiles many steps from one store)."""
    if str(problem) not in _warned:
        _warned.add(str(problem))
        log.warning("warning: compiled-step store not used: %s (a stored step is unpickled only where no one "
                    "but you or root could have written it); the step is traced afresh", problem)


def _step_key(function: Callable, identity: str) -> str:
    """A hash of `identity`, the step's name, the versions it was compiled under and the source of the
    packages a traced step reads (mtpc and circuitc)."""
    digest = hashlib.sha256()
    for part in (identity, function.__qualname__, torch.__version__, _version("transformers"), _version("peft"),
                 _version("kernels"), sys.version, str(torch.get_num_threads()), repr(sorted(CPU_OPTIONS.items()))):
        digest.update(part.encode() + b"\0")
    digest.update(_source_digest())
    return digest.hexdigest()[:32]


def _version(distribution: str) -> str:
    """The installed version of `distribution`, or "" when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return ""


def _source_digest() -> bytes:
    """A hash of every Python file of the packages a step's code comes from (this one and circuitc)."""
    import circuitc

    digest = hashlib.sha256()
    for package in (Path(__file__).resolve().parent.parent, Path(circuitc.__file__).resolve().parent):
        for file in sorted(package.rglob("*.py")):
            digest.update(str(file.relative_to(package)).encode() + b"\0" + file.read_bytes())
    return digest.digest()
