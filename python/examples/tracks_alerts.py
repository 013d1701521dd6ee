"""A Python business rule inside the dataflow: pipelines/camera-tracks-alerts.yaml tracks people
on the 4 bundled cameras and its last stage, the Python function `alerts` of
pipelines/udf/near_camera.py, turns tracked people close to the camera into alert rows. Here
they are streamed into pandas and summed up per camera and track.

    scripts/python-tests.sh            # once: builds and installs the package (target/python-venv)
    target/python-venv/bin/python python/examples/tracks_alerts.py
"""

from pathlib import Path

import pandas as pd

import riffle

PIPELINE = Path(__file__).resolve().parents[2] / "pipelines" / "camera-tracks-alerts.yaml"

# The schema after each stage, the Python stage's included.
for name, schema in riffle.validate(PIPELINE)[-2:]:
    print(f"after {name}: {', '.join(schema.names)}")

batches = [batch.to_pandas() for batch in riffle.stream(PIPELINE)]
if not batches:
    print("no alerts")
else:
    alerts = pd.concat(batches)
    per_track = alerts.groupby(["camera_id", "track_id"]).agg(
        frames=("frame", "count"), first=("frame", "min"), last=("frame", "max")
    )
    print(f"{len(alerts)} alerts from {len(per_track)} tracks:")
    print(per_track)
