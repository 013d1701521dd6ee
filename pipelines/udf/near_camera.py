"""A business rule on tracks, for pipelines/camera-tracks-alerts.yaml: one alert row per tracked
person whose feet (the box's bottom edge) are in the bottom quarter of the frame, i.e. close to
the camera. Called with each batch of tracked frames as a pyarrow.RecordBatch; returns the
alerts as another (no rows is fine).

Vectorised with pyarrow.compute: no Python loop over rows."""

import pyarrow as pa
import pyarrow.compute as pc

# Feet below this share of the frame's height raise an alert.
NEAR = 0.75


def alerts(batch: pa.RecordBatch) -> pa.RecordBatch:
    people = pc.list_flatten(batch["detections"])          # one struct per detection
    frame_of = pc.list_parent_indices(batch["detections"])  # its row in `batch`
    height = pc.cast(pc.take(batch["height"], frame_of), pa.float32())
    near = pc.and_(
        pc.is_valid(people.field("track_id")),
        pc.greater_equal(people.field("y2"), pc.multiply(height, NEAR)),
    )
    rows = pc.filter(frame_of, near)
    kept = pc.filter(people, near)
    return pa.RecordBatch.from_arrays(
        [
            pc.take(batch["camera_id"], rows),
            pc.take(batch["frame"], rows),
            kept.field("track_id"),
            kept.field("score"),
            kept.field("y2"),
            pc.filter(height, near),
        ],
        names=["camera_id", "frame", "track_id", "score", "feet_y", "frame_height"],
    )
