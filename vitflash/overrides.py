"""A mistyped key on the command line stops with the keys it may have meant.

    @checked_keys(CONFIGS, "train")
    @hydra.main(version_base="1.3", config_path="../configs", config_name="train")
    @short_errors
    def main(cfg): ...

Hydra rejects `optim.lr=0.1` (the optimizer's node is `model.optimizer`) with "Key 'optim' is
not in struct" and the advice to write `+optim.lr=0.1`, which adds a key that nothing reads:
the run then trains with the default learning rate, and the value the user typed is lost.
`checked_keys` looks at the overrides before Hydra does, and stops the run with one message
that names every such override at once:
- a key the composed config does not have, naming the closest keys that exist
  (`model.optimizer.lr`) and how to list them all; but where the node's class takes that
  argument and the yaml only leaves it out (`trainer.limit_train_batches`), the `+` it needs;
- a `+` key under a top-level name the config does not have (nothing would read it), or
  under a node whose class takes no such argument (the run would stop only once it builds it).
A sweep over config groups is checked in each of its jobs' configs, before the first job runs.
Everything else (group choices, values, Hydra's own keys) is left to Hydra, whose messages
already name the choices.
"""
from __future__ import annotations

import contextlib
import difflib
import functools
import inspect
import io
import itertools
import sys
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig, OmegaConf

# A prefix of the override types: "+" adds a key, "++" adds or replaces, "~" deletes.
_PREFIX = {"ADD": "+", "FORCE_ADD": "++", "DEL": "~", "CHANGE": ""}
# A sweep over more combinations of config groups is checked on its first this many jobs.
_MOST_JOBS = 64


def checked_keys(config_dir: Path, config_name: str) -> Callable:
    """Wrap a `hydra.main` function: when called from the command line (no arguments), check
    the overrides in sys.argv against the config first (`unknown_key_error`), and on a mistyped
    key print the error and exit with status 1 before Hydra composes or makes a run folder."""

    def decorate(main: Callable) -> Callable:
        @functools.wraps(main)
        def wrapper(*args, **kwargs):
            if not args and not kwargs:
                try:
                    message = unknown_key_error(config_dir, config_name, sys.argv[1:])
                except Exception:  # noqa: BLE001 - a helper must never be why a valid command fails:
                    message = None  # Hydra then composes and reports as it always did
                if message is not None:
                    print(f"Error: {message}", file=sys.stderr)
                    sys.exit(1)
            return main(*args, **kwargs)

        return wrapper

    return decorate


def unknown_key_error(config_dir: Path, config_name: str, argv: list[str]) -> str | None:
    """The error naming each override in `argv` (a script's command line) that sets a key the
    composed config lacks, or adds one under a top-level name it lacks (in a sweep, those of the
    first job that has any; one per line when there are several); None when there is none,
    or when the command line is one this check leaves to Hydra (help, another config, an
    override Hydra cannot parse, a group choice that does not compose)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    try:
        from hydra._internal.utils import get_args_parser  # Hydra's own command-line parser
    except ImportError:  # a Hydra that moved it: its own error messages remain
        return None
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with contextlib.redirect_stderr(io.StringIO()):  # argparse's usage lines: Hydra prints its own
            args = get_args_parser().parse_args(argv)
        overrides = OverridesParser.create().parse_overrides(args.overrides)
    except (Exception, SystemExit):  # noqa: BLE001 - Hydra reports its own parse errors
        return None
    if (args.help or args.hydra_help or args.info or args.shell_completion or args.experimental_rerun
            or args.config_path or args.config_name or args.config_dir):
        return None

    groups, keys = [], []
    for override in overrides:
        key = override.key_or_group
        if key == "hydra" or key.startswith(("hydra.", "hydra/")) or override.package is not None:
            continue  # Hydra's own keys and groups (hydra/launcher=...), and packaged choices
        if "/" in key or (config_dir / key.replace(".", "/")).is_dir():
            # a group choice, or a sweep over choices: one line per choice
            prefix = _PREFIX[override.type.name]
            try:
                values = list(override.sweep_string_iterator()) if override.is_sweep_override() else None
            except HydraException:  # glob(...) over a group's options: Hydra expands it, with its config loader
                return None
            groups.append([override.input_line] if values is None else [f"{prefix}{key}={v}" for v in values])
        elif override.type.name in ("CHANGE", "ADD"):
            keys.append(override)
    if not keys:
        return None
    jobs = list(itertools.islice(itertools.product(*groups), _MOST_JOBS))
    swept = any(len(choices) > 1 for choices in groups)
    typed = " ".join(argv)
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            for job in jobs:
                cfg = compose(config_name, overrides=list(job))
                where = f" (in the sweep's job with {' '.join(job)})" if swept else ""
                problems = _unknown_keys(cfg, config_name, keys, typed, where)
                if problems:
                    hint = f"`python scripts/{config_name}.py --cfg job` prints every key and its value."
                    if len(problems) == 1:
                        return f"{problems[0]} {hint}"
                    return "\n".join([f"{len(problems)} overrides cannot be applied as typed:",
                                      *(f"- {problem}" for problem in problems), hint])
    except (HydraException, OmegaConfBaseException, OSError, ValueError):
        return None  # a mistyped group, or a value it cannot take: Hydra names the options itself
    return None


def _unknown_keys(cfg: DictConfig, config_name: str, keys: list, typed: str, where: str) -> list[str]:
    problems = []
    for override in keys:
        key, line = override.key_or_group, override.input_line
        parent, _, last = key.rpartition(".")
        if override.type.name == "CHANGE":
            if _has_key(cfg, key) is not False:
                continue
            target, takes = _target_takes(cfg, parent, last)
            if takes:
                # Hydra's advice is right here: the class takes the argument, the yaml leaves it out
                problems.append(f"{line}{where}: the {config_name} config does not list {key}, but {target} "
                                f"takes {last}: add it with a plus, +{line}")
                continue
            problem = f"{line}{where}: the {config_name} config has no key {key}, so there is nothing to set."
        else:
            top = key.split(".")[0]
            if top not in cfg.keys():
                # a top-level key added to be read through an interpolation (${top...}) is used
                if "${" + top in typed:
                    continue
                problem = f"{line}{where}: nothing reads {key}, because the {config_name} config has no {top}."
            else:
                target, takes = _target_takes(cfg, parent, last)
                if takes is not False or _has_key(cfg, key):
                    continue
                problem = f"{line}{where}: {target} (the node {parent}) takes no argument {last}."
        close = suggestions(cfg, key)
        problems.append(problem + (f" Did you mean {' or '.join(close)}?" if close else ""))
    return problems


def _target_takes(cfg: DictConfig, parent: str, name: str) -> tuple[str | None, bool | None]:
    """The `_target_` of the node at `parent` and whether it takes an argument `name`: None
    when the node has no target, the target does not import, or it takes **kwargs."""
    from hydra.utils import get_object

    node = OmegaConf.select(cfg, parent) if parent else cfg
    target = node.get("_target_") if isinstance(node, DictConfig) else None
    if not isinstance(target, str):
        return None, None
    try:
        params = inspect.signature(get_object(target)).parameters.values()
    except (ImportError, AttributeError, ValueError, TypeError):
        return target, None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return target, None
    return target, any(p.name == name and p.kind is not inspect.Parameter.VAR_POSITIONAL for p in params)


def _has_key(cfg: DictConfig, key: str) -> bool | None:
    """Whether `key` (dotted) is in `cfg`: False when a node on its path lacks the next part,
    None when the path passes through something other than a dict node (a list, a plain
    value, a null or missing node), which Hydra judges itself."""
    node = cfg
    for part in key.split("."):
        if not isinstance(node, DictConfig) or node._is_none() or node._is_missing():
            return None
        if part not in node.keys():
            return False
        node = node._get_node(part)
    return True


def _paths(node: DictConfig, prefix: str = "") -> list[str]:
    """Every dotted key under `node`, nodes and leaves alike (the values are not resolved)."""
    paths = []
    for name in node.keys():
        path = f"{prefix}{name}"
        paths.append(path)
        child = node._get_node(name)
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            paths.extend(_paths(child, f"{path}."))
    return paths


def suggestions(cfg: DictConfig, key: str, most: int = 3) -> list[str]:
    """Up to `most` keys of `cfg` that `key` may have meant, the likeliest first, from the first
    of these that finds any: keys under the same parent with a similar last part
    (`model.optimizer.lrr` -> `model.optimizer.lr`, `trainer.epochs` -> `trainer.max_epochs`);
    keys anywhere with the same last part (`optim.lr` -> `model.optimizer.lr`); keys similar
    as a whole."""
    paths = [p for p in _paths(cfg) if p != "hydra" and not p.startswith("hydra.")]
    parent, _, last = key.rpartition(".")

    def similar(a: str, b: str) -> float:
        return difflib.SequenceMatcher(None, a, b).ratio()

    siblings = [p for p in paths if p.rpartition(".")[0] == parent]
    near = sorted((p for p in siblings if similar(last, p.rpartition(".")[2]) >= 0.6
                   or last in p.rpartition(".")[2] or p.rpartition(".")[2] in last),
                  key=lambda p: -similar(last, p.rpartition(".")[2]))
    same_name = sorted((p for p in paths if p.rpartition(".")[2] == last), key=len)
    whole = [p for p in difflib.get_close_matches(key, paths, n=most + 2, cutoff=0.75) if not key.startswith(p + ".")]
    for tier in (near, same_name, whole):
        if tier:
            return tier[:most]
    return []
