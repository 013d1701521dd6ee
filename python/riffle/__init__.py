"""Riffle from Python: validate, run and stream dataflow inference pipelines.

A pipeline is a YAML file's path or the same pipeline as a dict (relative paths in a dict
start from the working directory)::

    import riffle
    for batch in riffle.stream("pipelines/camera-perception.yaml"):
        print(batch.to_pandas()[["camera_id", "frame", "detections_count"]])

``validate`` gives the schema after each stage, ``run`` runs to the end and returns the
summary, ``stream`` yields the results as ``pyarrow.RecordBatch`` objects while the pipeline
runs. Ctrl-C stops a run as SIGTERM stops ``riffle run``: the open epochs finish first.
"""

from __future__ import annotations

import glob
import json
import os
import sys
from pathlib import Path
from typing import Any, List, Mapping, Optional, Tuple, Union

__all__ = ["PipelineError", "validate", "run", "stream"]

Pipeline = Union[str, "os.PathLike[str]", Mapping[str, Any]]


class PipelineError(ValueError):
    """A pipeline that does not validate: ``file``, ``line`` (``None`` for a dict or when the
    problem has none), ``field`` (dotted, e.g. ``stages[2].model.path``) and ``message``."""

    def __init__(self, text: str, file: str, line: Optional[int], field: str, message: str):
        super().__init__(text)
        self.file = file
        self.line = line
        self.field = field
        self.message = message


def _onnx_runtime() -> None:
    """Points Riffle at the ONNX Runtime library of the ``onnxruntime`` wheel, unless
    ``RIFFLE_ORT_LIB`` already names one."""
    if os.environ.get("RIFFLE_ORT_LIB"):
        return
    try:
        import importlib.util

        spec = importlib.util.find_spec("onnxruntime")
    except (ImportError, ValueError):
        return
    if spec is None or not spec.submodule_search_locations:
        return
    for folder in spec.submodule_search_locations:
        found = sorted(glob.glob(os.path.join(folder, "capi", "libonnxruntime.so.*")))
        if found:
            os.environ["RIFFLE_ORT_LIB"] = found[-1]
            return


_onnx_runtime()

from . import _native  # noqa: E402  (after the library's path is set)

DICT_NAME = "pipeline (a Python dict)"


def _dump(value: Any, path: str, lines: List[str], paths: List[str], indent: str) -> None:
    """``value`` as JSON, one key or item a line, with the dotted path of each line."""
    if isinstance(value, Mapping) and value:
        lines.append("{")
        paths.append(path)
        for i, (key, item) in enumerate(value.items()):
            start = len(lines)
            _dump(item, f"{path}.{key}" if path else str(key), lines, paths, indent + " ")
            lines[start] = f"{indent} {json.dumps(str(key))}: {lines[start].lstrip()}"
            if i < len(value) - 1:
                lines[-1] += ","
        lines.append(indent + "}")
        paths.append(path)
    elif isinstance(value, (list, tuple)) and value:
        lines.append("[")
        paths.append(path)
        for i, item in enumerate(value):
            start = len(lines)
            _dump(item, f"{path}[{i}]", lines, paths, indent + " ")
            lines[start] = f"{indent} {lines[start].lstrip()}"
            if i < len(value) - 1:
                lines[-1] += ","
        lines.append(indent + "]")
        paths.append(path)
    else:
        lines.append(json.dumps(value))
        paths.append(path)


def _given(pipeline: Pipeline) -> Tuple[str, Optional[str], List[str]]:
    """The file naming the pipeline, its text when it is a dict, and each line's dotted path."""
    if isinstance(pipeline, Mapping):
        lines: List[str] = []
        paths: List[str] = []
        _dump(pipeline, "", lines, paths, "")
        # JSON is YAML; relative paths start from the working directory.
        return os.path.join(os.getcwd(), DICT_NAME), "\n".join(lines), paths
    return os.fspath(pipeline), None, []


def _lineless(paths: List[str], error: PipelineError) -> PipelineError:
    """A dict's error: its JSON lines are not the user's, so the line gives way to the key's
    dotted path where the parser named only the key."""
    if not paths:
        return error
    if error.line and 0 < error.line <= len(paths):
        full = paths[error.line - 1]
        if full.endswith(error.field) and len(full) > len(error.field):
            error.field = full
    error.line = None
    where = f"{error.field}: " if error.field else ""
    error.args = (f"{DICT_NAME}: {where}{error.message}",)
    return error


def validate(pipeline: Pipeline) -> List[Tuple[str, "Any"]]:
    """The schema after the source and after each stage: ``[(name, pyarrow.Schema)]``.
    Raises ``PipelineError`` naming the file, line and field of the first problem."""
    file, text, paths = _given(pipeline)
    try:
        return list(_native.validate(file, text))
    except PipelineError as e:
        raise _lineless(paths, e) from None


def run(
    pipeline: Pipeline,
    workers: Optional[int] = None,
    checkpoint: Optional[str] = None,
    output: Optional[Union[str, "os.PathLike[str]"]] = None,
    processes: Optional[int] = None,
    base_port: Optional[int] = None,
) -> dict:
    """Runs the pipeline to its end (or to Ctrl-C) and returns its summary: results, latency
    percentiles, per-stage counts and timings, dead-letter reasons, ``exit_code``.

    ``workers`` overrides ``runtime.workers`` (per process); ``checkpoint`` is a directory or an
    ``s3://bucket/prefix`` to checkpoint into and resume from; ``output`` replaces the sink's
    file (as ``riffle run --output``). ``processes=N`` runs a local cluster of N processes
    (``python -m riffle``, each with its workers, ports from ``base_port``, default 2101) as
    ``riffle run --processes N`` does; each prints its own figures, and the summary is the
    cluster's (``exit_code``, ``restarts``, ``stopped``)."""
    file, text, paths = _given(pipeline)
    try:
        return _native.run(
            file,
            text,
            workers,
            checkpoint,
            None if output is None else os.fspath(output),
            processes,
            None,
            base_port,
            sys.executable,
        )
    except PipelineError as e:
        raise _lineless(paths, e) from None


def stream(
    pipeline: Pipeline,
    workers: Optional[int] = None,
    checkpoint: Optional[str] = None,
):
    """The pipeline's results as ``pyarrow.RecordBatch`` objects while it runs, in place of
    its sink (each epoch's as it completes)::

        with riffle.stream("p.yaml") as results:
            for batch in results:
                ...

    ``close()`` (or leaving the ``with`` block, or Ctrl-C) stops the run cleanly; ``summary``
    is the run's summary once it has ended."""
    file, text, paths = _given(pipeline)
    try:
        # Its errors here, not at the first batch.
        _native.validate(file, text)
        return _native.stream(file, text, workers, checkpoint)
    except PipelineError as e:
        raise _lineless(paths, e) from None
