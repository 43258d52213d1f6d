"""Python API of Vigil, a failure-aware resource manager for HPC clusters.

``vigil.Client`` talks to an instance's broker over ``VIGIL_URI`` (submit, wait, attach, cancel, list jobs,
eventlogs, resource status); ``vigil.VigilExecutor`` is a ``concurrent.futures.Executor`` whose futures are jobs
and resolve to their exit codes. See docs/python.md.
"""

from .client import Client, JobOutput, OutputLine, Welcome, exit_code, job_exit_code
from .errors import ConnectError, ConnectionLost, JobException, VigilError, f58, parse_jobid
from .executor import VigilExecutor, VigilFuture
from .jobspec import UnknownOptionError
from .jobspec import from_command as jobspec_from_command

__all__ = [
    "Client",
    "ConnectError",
    "ConnectionLost",
    "JobException",
    "JobOutput",
    "OutputLine",
    "UnknownOptionError",
    "VigilError",
    "VigilExecutor",
    "VigilFuture",
    "Welcome",
    "exit_code",
    "f58",
    "job_exit_code",
    "jobspec_from_command",
    "parse_jobid",
]
__version__ = "0.1.0"
