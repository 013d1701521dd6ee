"""The camera pipeline's detections into pandas as they come: people per camera, updated
after every batch of results.

    scripts/python-tests.sh            # once: builds and installs the package (target/python-venv)
    target/python-venv/bin/python python/examples/stream_to_pandas.py
"""

from pathlib import Path

import pandas as pd

import riffle

PIPELINE = Path(__file__).resolve().parents[2] / "pipelines" / "camera-perception.yaml"

seen = []
with riffle.stream(PIPELINE) as results:
    for batch in results:
        seen.append(batch.to_pandas()[["camera_id", "frame", "detections_count"]])
        frames = pd.concat(seen)
        people = frames.groupby("camera_id")["detections_count"].agg(["count", "mean"])
        print(f"{len(frames)} frames so far; people per frame by camera:")
        print(people.rename(columns={"count": "frames", "mean": "people"}).round(2), "\n")

print(f"{results.summary['results']} results, p99 ready {results.summary['ready_p99_ms']:.0f} ms")
