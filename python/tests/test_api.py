"""The Python API against the bundled data: validation errors, runs given as files and dicts,
results streamed as pyarrow batches, and a stream closed early.

Needs the wheel installed (``scripts/test.sh`` builds it and installs it into a fresh venv)
and the repository's data and models (``scripts/setup.sh``, ``scripts/media.sh``)."""

import csv
import json
import os
import time
from pathlib import Path

import pyarrow as pa
import pytest

import riffle

REPO = Path(__file__).resolve().parents[2]
CLICKS = REPO / "data" / "clickstream" / "obd-random-all-2000.csv"
PERCEPTION = REPO / "pipelines" / "camera-perception.yaml"


def top_slot(sink=None, **source):
    """The bundled clicks' top-slot impressions, as a dict."""
    return {
        "name": "top-slot",
        "source": {"csv": {"path": str(CLICKS), "batch_size": 128, **source}},
        "stages": [
            {"filter": {"column": "position", "op": "eq", "value": 1}},
            {"select": {"columns": ["item_id", "click"]}},
        ],
        "sink": sink or {"stdout": {}},
        "runtime": {"workers": 2, "epoch_records": 256},
    }


@pytest.fixture(autouse=True)
def in_a_temporary_folder(tmp_path, monkeypatch):
    """A dict's relative paths (its default dead-letter file) start from the working
    directory: each test has its own."""
    monkeypatch.chdir(tmp_path)


def expected_top_slot():
    with open(CLICKS, newline="") as f:
        return [(int(r["item_id"]), int(r["click"])) for r in csv.DictReader(f) if r["position"] == "1"]


def test_validate_gives_the_schema_after_each_stage():
    stages = riffle.validate(PERCEPTION)
    assert [name for name, _ in stages] == ["source", "decode", "resize", "model", "detections", "select"]
    assert all(isinstance(schema, pa.Schema) for _, schema in stages)
    last = stages[-1][1]
    assert last.field("detections_count").type == pa.int64() or "detections_count" in last.names
    assert "tensor" in stages[2][1].names and "tensor" not in last.names


def test_a_bad_file_names_its_file_line_and_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: bad\n"
        f"source: {{ csv: {{ path: \"{CLICKS}\" }} }}\n"
        "stages:\n"
        "  - filter: { column: position, op: eq, value: 1 }\n"
        "  - select: { columns: [item_id, no_such_column] }\n"
        "sink: { stdout: {} }\n"
    )
    with pytest.raises(riffle.PipelineError) as caught:
        riffle.validate(str(bad))
    e = caught.value
    assert (e.file, e.line) == (str(bad), 5), e
    assert e.field.startswith("stages[1].select"), e.field
    assert "no_such_column" in e.message
    # A dict has no lines of its own: the field says where.
    pipeline = top_slot()
    pipeline["stages"][0]["filter"]["op"] = "bigger"
    with pytest.raises(riffle.PipelineError) as caught:
        riffle.run(pipeline)
    assert caught.value.line is None and caught.value.field.startswith("stages[0].filter"), caught.value


def test_a_bad_number_in_a_flow_mapping_names_its_own_key(tmp_path):
    bad = tmp_path / "batch.yaml"
    bad.write_text(
        f"source: {{ csv: {{ path: \"{CLICKS}\" }} }}\n"
        "stages:\n"
        "  - select: { columns: [item_id] }\n"
        "  - model: { path: m.onnx, batch: { max_size: -3, max_delay_ms: 5 } }\n"
        "sink: { stdout: {} }\n"
    )
    with pytest.raises(riffle.PipelineError) as caught:
        riffle.validate(str(bad))
    e = caught.value
    assert (e.line, e.field) == (4, "stages[1].model.batch.max_size"), e
    assert e.message == "expected an integer from 1 to 65536, found -3", e


def test_a_dict_runs_to_its_end_with_a_summary(tmp_path):
    out = tmp_path / "top.jsonl"
    summary = riffle.run(top_slot({"jsonl": {"path": str(out)}}))
    expected = expected_top_slot()
    assert summary["exit_code"] == 0 and not summary["stopped"]
    assert summary["results"] == len(expected)
    assert [s["name"] for s in summary["stages"]][:3] == ["source", "filter", "select"]
    assert out.read_text().count("\n") == len(expected)


def test_stream_yields_every_result_as_record_batches():
    batches = list(riffle.stream(top_slot()))
    assert batches and all(isinstance(b, pa.RecordBatch) for b in batches)
    table = pa.Table.from_batches(batches)
    assert table.schema.names == ["item_id", "click"]
    got = sorted(zip(table.column("item_id").to_pylist(), table.column("click").to_pylist()))
    assert got == sorted(expected_top_slot())


def test_the_camera_pipeline_streams_into_pandas():
    frames = []
    with riffle.stream(PERCEPTION) as results:
        for batch in results:
            frames.append(batch.to_pandas())
    summary = results.summary
    import pandas as pd

    df = pd.concat(frames)
    # 4 cameras × 250 frames bundled, every frame answered once.
    assert len(df) == summary["results"] == 250
    assert not df.duplicated(["camera_id", "frame"]).any()
    assert (df["detections_count"] > 0).any()


def test_closing_a_stream_stops_the_run_cleanly():
    # The bundled frames read over and over, paced: only close() ends it.
    endless = {
        "name": "endless",
        "source": {
            "images": {
                "path": str(REPO / "data" / "frames" / "bikes"),
                "repeat": 1_000_000,
                "max_records_per_second": 200,
                "batch_size": 8,
            }
        },
        "stages": [{"select": {"columns": ["camera_id", "frame"]}}],
        "sink": {"stdout": {}},
        "runtime": {"workers": 2, "epoch_records": 16},
    }
    stream = riffle.stream(endless)
    first = next(stream)
    assert first.num_rows > 0
    started = time.monotonic()
    stream.close()
    assert time.monotonic() - started < 30
    assert stream.summary["stopped"] is True
    assert list(stream) == []
    # The next run is not stopped by this one's request.
    assert riffle.run(top_slot())["results"] == len(expected_top_slot())


def free_port_pair():
    """A port whose next is free too (process i listens on base + i)."""
    import socket

    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                    return port
                except OSError:
                    continue
    raise RuntimeError("no free pair of ports")


def test_a_dict_runs_as_a_local_cluster_of_processes(tmp_path):
    out = tmp_path / "top.jsonl"
    pipeline = top_slot({"jsonl": {"path": str(out)}})
    pipeline["runtime"]["workers"] = 1
    summary = riffle.run(pipeline, processes=2, base_port=free_port_pair())
    assert summary["exit_code"] == 0 and summary["restarts"] == 0
    # The supervisor's summary has no figures of its own: its processes print theirs.
    assert "results" not in summary
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["item_id"], r["click"]) for r in rows) == sorted(expected_top_slot())
