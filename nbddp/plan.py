"""The plan nbddp.needs computes: where each top-level statement of the notebook runs (its docstring says what each
field holds)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Plan:
    end: int | None = None
    marked: bool = False  # the notebook already has the runtime's line (converting converted code)
    once: set = field(default_factory=set)  # ids of the statements that run on rank 0 only
    files: dict = field(default_factory=dict)  # id of a save -> the paths it writes that training reads later
    calls: dict = field(default_factory=dict)  # id of each statement read -> its live calls
    shares: dict = field(default_factory=dict)  # id of a statement rank 0 runs for every rank -> the names to give
    differs: dict = field(default_factory=dict)  # id of a needed statement whose value differs by rank -> its call
    setup: dict = field(default_factory=dict)  # id of a statement every rank runs as set-up of a library -> libraries
    outside: dict = field(default_factory=dict)  # id of a needed statement calling another library -> (names, libs)
    nested_once: set = field(default_factory=set)  # ids of statements inside blocks and functions every rank runs that
    # only call another library for its effect (`requests.post(hook)`, `notify(text)` in a loop that trains), and of
    # the statements holding them
    libraries: set = field(default_factory=set)  # the libraries training's own objects come from, and torch
    packages: set = field(default_factory=set)  # the packages the notebook imports
    unread: dict = field(default_factory=dict)  # id of a `%run` line whose file cannot be read -> the line
    alone: dict = field(default_factory=dict)  # id of a statement that only acts outside the process -> its paths
    results: dict = field(default_factory=dict)  # id of a line that keeps a program's result -> the names it binds
    later: dict = field(default_factory=dict)  # id of a statement in `alone` -> its loops' names read later
    stops: dict = field(default_factory=dict)  # id of a statement that trains and stops by each rank's clock -> call
