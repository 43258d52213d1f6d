"""Jobspecs (RFC 14/25, version 1) for a command, built as ``vigil submit -N NODES -n NTASKS -c CORES`` builds them
(``runtime/proto/src/jobspec/builder.rs``): the same resources, tasks and system attributes, so the instance
sees the same request whichever way a job comes."""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional, Sequence


def _div_ceil(a: int, b: int) -> int:
    return -(-a // b)


def _count(name: str, v: Optional[int]) -> Optional[int]:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, not {type(v).__name__}")
    return v


def from_command(
    command: Sequence[str],
    nodes: Optional[int] = None,
    ntasks: Optional[int] = None,
    cores_per_task: int = 1,
    gpus_per_task: int = 0,
    time_limit: Optional[float] = None,
    cwd: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    name: Optional[str] = None,
    exclusive: bool = False,
) -> Dict[str, Any]:
    """The jobspec of ``command`` (a list of strings: program and arguments).

    ``nodes`` (-N), ``ntasks`` (-n), ``cores_per_task`` (-c), ``gpus_per_task`` (-g); ``time_limit`` in seconds
    (-t; 0 or None: none); ``cwd`` (default: the current directory); ``env``: the job's whole environment
    (default: this process's, without its ``VIGIL_*`` variables, as the CLI sends it); ``name`` (--job-name);
    ``exclusive`` (--exclusive, needs ``nodes``). Raises ValueError naming the option, with the CLI's words.
    """
    if isinstance(command, (str, bytes)) or not command or not all(isinstance(a, str) for a in command):
        raise ValueError("command must be a non-empty list of strings (program and arguments)")
    nodes, ntasks = _count("nodes", nodes), _count("ntasks", ntasks)
    cores_per_task, gpus_per_task = _count("cores_per_task", cores_per_task), _count("gpus_per_task", gpus_per_task)
    if nodes is not None and nodes < 1:
        raise ValueError("-N must be at least 1")
    if ntasks is not None and ntasks < 1:
        raise ValueError("-n must be at least 1")
    if cores_per_task is None or cores_per_task < 1:
        raise ValueError("-c must be at least 1")
    if gpus_per_task is None or gpus_per_task < 0:
        raise ValueError("-g must be at least 0")
    duration = float(time_limit or 0.0)
    if duration != duration or duration in (float("inf"), float("-inf")):
        raise ValueError("-t/--time-limit must be a finite number of seconds")
    if duration < 0:
        raise ValueError("-t/--time-limit must be >= 0")
    if exclusive and nodes is None:
        raise ValueError("--exclusive requires -N/--nodes")
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
                f"-n {ntasks} is fewer tasks than the {nodes} node(s) of -N {nodes}: every node of a job runs a task "
                f"at least (give -n {nodes} or more, or fewer nodes)"
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
