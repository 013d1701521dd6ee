"""Python stages (``python: {path, function}``) run by the package: the function's output schema
learnt at validation, its results streamed, an exception becoming dead letters with its reason,
and a ``kill -9`` under it with checkpoints losing and repeating nothing."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pytest

import riffle

REPO = Path(__file__).resolve().parents[2]
CLICKS = REPO / "data" / "clickstream" / "obd-random-all-2000.csv"
VIDEOS = REPO / "data" / "videos"
FRAMES = 60

# A business rule on impressions: the top slot's clicked ones, with a label; it refuses a batch
# holding a click on item 9 in the top slot.
RULE = textwrap.dedent(
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    def clicked_top(batch):
        top = batch.filter(pc.and_(pc.equal(batch["position"], 1), pc.equal(batch["click"], 1)))
        if 9 in top["item_id"].to_pylist():
            raise ValueError("item 9 is withdrawn")
        label = pc.binary_join_element_wise(
            pc.cast(top["item_id"], pa.string()), pc.cast(top["position"], pa.string()), "@")
        return pa.RecordBatch.from_arrays([top["item_id"], label], names=["item_id", "label"])
    """
)

# Even frames of each camera, labelled; sleeps UDF_SLEEP seconds a call (long enough to kill).
EVEN = textwrap.dedent(
    """
    import os, time
    import pyarrow as pa
    import pyarrow.compute as pc

    def even_frames(batch):
        time.sleep(float(os.environ.get("UDF_SLEEP", "0")))
        keep = batch.filter(pc.equal(pc.bit_wise_and(batch["frame"], 1), 0))
        label = pc.binary_join_element_wise(
            keep["camera_id"], pc.cast(keep["frame"], pa.string()), "#")
        return pa.RecordBatch.from_arrays([label], names=["label"])
    """
)


@pytest.fixture(autouse=True)
def in_a_temporary_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def clicks_pipeline(udf, sink=None):
    return {
        "name": "rule",
        "source": {"csv": {"path": str(CLICKS), "batch_size": 100}},
        "stages": [{"python": {"path": str(udf), "function": "clicked_top"}}],
        "sink": sink or {"stdout": {}},
        "dead_letter": {"jsonl": {"path": "dead.jsonl"}},
        "runtime": {"workers": 2, "max_dead_letter_ratio": 1.0},
    }


def test_validation_learns_the_functions_output_and_stream_yields_it(tmp_path):
    udf = tmp_path / "rule.py"
    udf.write_text(RULE.replace("raise ValueError", "pass  #"))
    stages = riffle.validate(clicks_pipeline(udf))
    assert stages[-1][0] == "python"
    assert stages[-1][1].names == ["item_id", "label"]
    assert stages[-1][1].field("label").type == pa.string()

    table = pa.Table.from_batches(list(riffle.stream(clicks_pipeline(udf))))
    import csv

    with open(CLICKS, newline="") as f:
        expected = sorted(
            f"{r['item_id']}@1" for r in csv.DictReader(f) if r["position"] == "1" and r["click"] == "1"
        )
    assert expected and sorted(table.column("label").to_pylist()) == expected


def test_an_exception_sends_its_batch_to_dead_letters_with_the_reason(tmp_path):
    udf = tmp_path / "rule.py"
    udf.write_text(RULE)
    summary = riffle.run(clicks_pipeline(udf, {"jsonl": {"path": "out.jsonl"}}))
    letters = [json.loads(line) for line in open("dead.jsonl")]
    assert letters, "the exception landed"
    assert all(d["stage"] == "python" for d in letters)
    assert all("ValueError: item 9 is withdrawn" in d["reason"] for d in letters)
    # The failing batch's rows, the clicked one among them; the other batches' results arrived.
    rows = [json.loads(d["record"]) for d in letters]
    assert {"item_id": 9, "position": 1, "click": 1}.items() <= next(
        r for r in rows if r["item_id"] == 9 and r["position"] == 1
    ).items()
    results = [json.loads(line) for line in open("out.jsonl")]
    assert summary["results"] == len(results) == 3
    assert 9 not in {r["item_id"] for r in results}


def test_a_function_that_does_not_exist_names_the_field(tmp_path):
    udf = tmp_path / "rule.py"
    udf.write_text(RULE)
    bad = clicks_pipeline(udf)
    bad["stages"][0]["python"]["function"] = "nope"
    with pytest.raises(riffle.PipelineError) as e:
        riffle.validate(bad)
    assert "python.function" in str(e.value) and "defines no `nope`" in str(e.value)


def test_kill_9_under_a_python_stage_then_restart_is_exactly_once(tmp_path):
    (tmp_path / "even.py").write_text(EVEN)
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(
        textwrap.dedent(
            f"""
            source: {{ video: {{ glob: "{VIDEOS}/*.mp4", batch_size: 4, max_frames: {FRAMES} }} }}
            stages:
              - select: {{ columns: [camera_id, frame] }}
              - python: {{ path: even.py, function: even_frames }}
            sink: {{ jsonl: {{ path: out.jsonl }} }}
            runtime: {{ workers: 2, epoch_records: 16, checkpoint: {{ dir: ckpt, interval_ms: 300 }} }}
            """
        )
    )
    out, ckpt = tmp_path / "out.jsonl", tmp_path / "ckpt"
    script = f"import riffle; riffle.run({str(pipeline)!r})"
    run = subprocess.Popen(
        [sys.executable, "-c", script], env={**os.environ, "UDF_SLEEP": "0.1"}, stderr=subprocess.PIPE
    )

    def lines():
        return out.read_text().count("\n") if out.exists() else 0

    deadline = time.monotonic() + 60
    while not (ckpt.exists() and any(p.suffix == ".ckpt" for p in ckpt.iterdir()) and lines() >= 10):
        assert run.poll() is None, f"the run ended before the kill: {run.stderr.read().decode()}"
        assert time.monotonic() < deadline, "no checkpoint and results in 60 s"
        time.sleep(0.05)
    run.send_signal(signal.SIGKILL)
    run.wait()
    expected = {f"bikes-{c}#{f}" for c in range(4) for f in range(0, FRAMES, 2)}
    at_kill = lines()
    assert at_kill < len(expected), f"the kill landed mid-run: {at_kill} results written"

    summary = riffle.run(pipeline)
    assert summary["exit_code"] == 0
    got = [json.loads(line)["label"] for line in open(out)]
    assert len(got) == len(set(got)), "nothing repeated"
    assert set(got) == expected, "nothing lost"
