"""Jobspecs (RFC 14/25, version 1) for a command, built as ``vigil submit -N NODES -n NTASKS -c CORES`` builds them
(``runtime/proto/src/jobspec/builder.rs``): the same resources, tasks and system attributes, so the instance
sees the same request whichever way a job comes."""

from __future__ import annotations

import os
import re
from typing import Any, Dict, Mapping, Optional, Sequence, Union


def _div_ceil(a: int, b: int) -> int:
    return -(-a // b)


def _count(name: str, v: Optional[int]) -> Optional[int]:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, not {type(v).__name__}")
    return v


_FSD = re.compile(r"(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_UNITS = {"": 1.0, "s": 1.0, "ms": 0.001, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_time_limit(v: Union[None, int, float, str]) -> float:
    """A time limit in seconds (0: none) from a number of seconds or a Flux Standard Duration (RFC 23, as ``-t``
    takes one: ``30s``, ``10m``, ``1.5h``, ``2d``, ``250ms``; a string without a unit is seconds; ``inf``,
    ``infinity`` or ``none``: no limit). ValueError/TypeError naming ``time_limit`` otherwise."""
    if v is None:
        return 0.0
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise TypeError(
            f"time_limit must be a number of seconds or a duration string such as '30s', '10m', '1h', "
            f"not {type(v).__name__}"
        )
    if isinstance(v, str):
        t = v.strip()
        if t.lower() in ("inf", "infinity", "none"):
            return 0.0
        if t.startswith("-"):
            raise ValueError(f"time_limit {v!r}: must be >= 0")
        m = _FSD.match(t)
        unit = t[m.end():] if m else None
        if m is None or unit not in _UNITS:
            raise ValueError(
                f"time_limit {v!r}: expected a number of seconds or a duration N[ms|s|m|h|d] (RFC 23) such as "
                f"'30s', '10m', '1h' or 'inf'"
            )
        duration = float(m.group()) * _UNITS[unit]
    else:
        duration = float(v)
    if duration != duration or duration in (float("inf"), float("-inf")):
        raise ValueError("time_limit (-t/--time-limit) must be a finite number of seconds")
    if duration < 0:
        raise ValueError("time_limit (-t/--time-limit) must be >= 0")
    return duration


_URGENCY_WORDS = {"hold": 0, "default": 16, "expedite": 31}


def parse_urgency(v: Union[None, int, str]) -> Optional[int]:
    """An urgency (RFC 21) as ``--urgency`` takes it: 0 to 31, or ``hold`` (0), ``default`` (16), ``expedite``
    (31). ValueError/TypeError naming ``urgency`` otherwise."""
    if v is None:
        return None
    if isinstance(v, str) and v.strip() in _URGENCY_WORDS:
        return _URGENCY_WORDS[v.strip()]
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"urgency must be an int from 0 to 31 (or hold, default, expedite), not {v!r}")
    if not 0 <= v <= 31:
        raise ValueError(f"urgency {v}: expected 0 to 31, hold, default or expedite (0 holds the job)")
    return v


def check_options(opts: Mapping[str, Any], extra: Sequence[str] = ()) -> None:
    """TypeError naming any option of ``opts`` that :func:`from_command` (or ``extra``) does not take, with the
    known ones: a typo (``tasks=2``) is refused at once, not passed on."""
    known = sorted([*COMMAND_OPTIONS, *extra])
    unknown = sorted(k for k in opts if k not in known)
    if unknown:
        raise UnknownOptionError(
            f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: the options of a command are "
            f"{', '.join(known)}"
        )


class UnknownOptionError(TypeError):
    """A keyword option that a command's submission does not take (a ``TypeError``, as Python raises for an
    unexpected keyword argument), naming it and the known ones."""


def from_command(
    command: Sequence[str],
    nodes: Optional[int] = None,
    ntasks: Optional[int] = None,
    cores_per_task: int = 1,
    gpus_per_task: int = 0,
    time_limit: Union[None, int, float, str] = None,
    cwd: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    name: Optional[str] = None,
    exclusive: bool = False,
) -> Dict[str, Any]:
    """The jobspec of ``command`` (a list of strings: program and arguments).

    ``nodes`` (-N), ``ntasks`` (-n), ``cores_per_task`` (-c), ``gpus_per_task`` (-g); ``time_limit`` in seconds
    or a duration string such as ``'10m'`` (-t; 0, None or ``'inf'``: none; see :func:`parse_time_limit`); ``cwd`` (default: the current directory); ``env``: the job's whole environment
    (default: this process's, without its ``VIGIL_*`` variables, as the CLI sends it); ``name`` (--job-name);
    ``exclusive`` (--exclusive, needs ``nodes``). Raises ValueError naming the keyword option (``nodes=0: must
    be at least 1 (vigil submit -N)``), TypeError for a value of the wrong type.
    """
    if isinstance(command, (str, bytes)) or not command or not all(isinstance(a, str) for a in command):
        raise ValueError("command must be a non-empty list of strings (program and arguments)")
    nodes, ntasks = _count("nodes", nodes), _count("ntasks", ntasks)
    cores_per_task, gpus_per_task = _count("cores_per_task", cores_per_task), _count("gpus_per_task", gpus_per_task)
    if nodes is not None and nodes < 1:
        raise ValueError(f"nodes={nodes}: must be at least 1 (vigil submit -N)")
    if ntasks is not None and ntasks < 1:
        raise ValueError(f"ntasks={ntasks}: must be at least 1 (vigil submit -n)")
    if cores_per_task is None or cores_per_task < 1:
        raise ValueError(f"cores_per_task={cores_per_task}: must be at least 1 (vigil submit -c)")
    if gpus_per_task is None or gpus_per_task < 0:
        raise ValueError(f"gpus_per_task={gpus_per_task}: must be at least 0 (vigil submit -g)")
    duration = parse_time_limit(time_limit)
    if env is not None:
        if not isinstance(env, Mapping):
            raise TypeError(f"env must be a mapping of names to strings, not {type(env).__name__}")
        bad = sorted(str(k) for k, v in env.items() if not isinstance(k, str) or not isinstance(v, str))
        if bad:
            raise TypeError(f"env: the value of every variable must be a string (and its name too): {', '.join(bad)}")
    if cwd is not None and not isinstance(cwd, (str, os.PathLike)):
        raise TypeError(f"cwd must be a path, not {type(cwd).__name__}")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a string, not {type(name).__name__}")
    if exclusive and nodes is None:
        raise ValueError("exclusive=True requires nodes (as vigil submit --exclusive requires -N)")
    leaves = [{"type": "core", "count": cores_per_task}]
    if gpus_per_task > 0:
        leaves.append({"type": "gpu", "count": gpus_per_task})

    def slot(count: int) -> Dict[str, Any]:
        return {"type": "slot", "count": count, "label": "task", "with": leaves}

    def node(count: int, s: Dict[str, Any]) -> Dict[str, Any]:
        n: Dict[str, Any] = {"type": "node", "count": count, "with": [s]}
        if exclusive:
            n["exclusive"] = True
        return n

    if nodes is None:
        resource, task_count = slot(ntasks or 1), {"per_slot": 1}
    elif ntasks is None:
        resource, task_count = node(nodes, slot(1)), {"per_slot": 1}
    else:
        if ntasks < nodes:
            raise ValueError(
                f"ntasks={ntasks} is fewer tasks than the {nodes} node(s) of nodes={nodes}: every node of a job runs "
                f"a task at least (give ntasks={nodes} or more, or fewer nodes)"
            )
        resource, task_count = node(nodes, slot(_div_ceil(ntasks, nodes))), {"total": ntasks}
    if env is None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
    system: Dict[str, Any] = {
        "duration": duration,
        "cwd": os.path.abspath(cwd) if cwd is not None else os.getcwd(),
        "environment": dict(sorted(env.items())),
    }
    if name is not None:
        system["job"] = {"name": name}
    return {
        "version": 1,
        "resources": [resource],
        "tasks": [{"command": list(command), "slot": "task", "count": task_count}],
        "attributes": {"system": system},
    }


#: The keyword options of :func:`from_command` (those of ``vigil submit``).
COMMAND_OPTIONS = (
    "nodes", "ntasks", "cores_per_task", "gpus_per_task", "time_limit", "cwd", "env", "name", "exclusive",
)
