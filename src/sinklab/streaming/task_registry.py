"""The streaming tasks by name: what ``sinklab stream TASK`` and :func:`sinklab.streaming.stream` offer.

A task registers a :class:`StreamTask`: its options class (a subclass of
:class:`~sinklab.streaming.options.StreamOptions`, from which the CLI makes its flags), the function that
evaluates it and the result type it returns. The perplexity and pass-key tasks register in
:mod:`sinklab.streaming.run`; further tasks (needle in a haystack, RULER-style suites) register the same way::

    from sinklab.streaming.task_registry import StreamTask, register_task

    register_task(StreamTask("needle", NeedleOptions, run_needle, NeedleResult, "needle in a haystack ..."))

where ``run_needle(subject, options, *, resume, on_result, progress, command) -> NeedleResult`` writes
nothing: ``resume`` is a previous result's content (a dict, or None) whose finished parts it may keep,
``on_result(partial_result)`` is called after each finished part (the CLI saves it, so a stopped run resumes),
``command`` is the command line to record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from sinklab.registry import Registry

__all__ = ["StreamTask", "TASKS", "register_task"]


@dataclass(frozen=True)
class StreamTask:
    """One streaming task.

    Attributes:
        name: ``sinklab stream NAME``.
        options: its :class:`~sinklab.streaming.options.StreamOptions` subclass.
        run: ``run(subject, options, *, resume, on_result, progress, command) -> Result`` (writes nothing).
        result: the :class:`~sinklab.result.Result` subclass it returns (``FILE``: what ``save`` writes).
        help: one paragraph for ``sinklab stream NAME --help``.
        summary: ``summary(result, out)``: the lines the CLI prints for a result saved in the folder ``out``, the
            files it wrote included (None: its repr and ``out/FILE``).
    """

    name: str
    options: type
    run: Callable
    result: type
    help: str
    summary: Callable | None = None


#: the registered streaming tasks (``sinklab stream --help`` lists them)
TASKS: Registry[StreamTask] = Registry("stream task")


def register_task(task: StreamTask) -> StreamTask:
    """Register ``task`` under ``task.name`` (ValueError if taken); returns it."""
    TASKS.register(task.name, task, description=task.help.split("\n")[0])
    return task
