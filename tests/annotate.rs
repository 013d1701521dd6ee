//! The `annotate` sink: each result's frame as a JPEG with its detections drawn, for people who
//! were not watching.

mod common;

use common::*;

fn pipeline(frames: &std::path::Path, sink: &str) -> String {
    format!(
        r#"
name: annotate
source:
  images: {{ path: "{frames}", batch_size: 4 }}
stages:{stages}
  - select: {{ columns: [camera_id, frame, path, detections_count, detections] }}
sink: {sink}
runtime: {{ workers: 1 }}
"#,
        frames = frames.display(),
        stages = detector_stages(0.5, 4),
    )
}

fn decode(bytes: &[u8]) -> (usize, usize, Vec<u8>) {
    use zune_jpeg::zune_core::{
        bytestream::ZCursor, colorspace::ColorSpace, options::DecoderOptions,
    };
    let options = DecoderOptions::default().jpeg_set_out_colorspace(ColorSpace::RGB);
    let mut d = zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(bytes), options);
    let pixels = d.decode().unwrap();
    let (w, h) = d.dimensions().unwrap();
    (w, h, pixels)
}

#[test]
fn writes_each_frame_with_its_boxes_drawn() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames_subset(tmp.path(), "cam", 40..48);
    let results = tmp.path().join("results.jsonl");
    let plain = write(
        tmp.path(),
        "plain.yaml",
        &pipeline(
            &frames,
            &format!("{{ jsonl: {{ path: \"{}\" }} }}", results.display()),
        ),
    );
    riffle_ok(&["run", "-q", plain.to_str().unwrap()]);
    let annotated = tmp.path().join("annotated");
    let drawing = write(
        tmp.path(),
        "annotate.yaml",
        &pipeline(
            &frames,
            &format!("{{ annotate: {{ dir: \"{}\" }} }}", annotated.display()),
        ),
    );
    riffle_ok(&["run", "-q", drawing.to_str().unwrap()]);

    let rows = read_jsonl(&results);
    assert_eq!(rows.len(), 8);
    let mut boxes_checked = 0;
    for row in rows {
        let frame = row["frame"].as_i64().unwrap();
        let file = annotated.join("cam").join(format!("{frame}.jpg"));
        let (w, h, drawn) = decode(&std::fs::read(&file).unwrap());
        let (ow, oh, original) = decode(&std::fs::read(row["path"].as_str().unwrap()).unwrap());
        assert_eq!((w, h), (ow, oh), "{}: the source's size", file.display());
        let px = |img: &[u8], x: usize, y: usize| {
            let at = (y.min(h - 1) * w + x.min(w - 1)) * 3;
            [img[at] as i32, img[at + 1] as i32, img[at + 2] as i32]
        };
        for d in row["detections"].as_array().unwrap() {
            let (x1, y1, x2) = (
                d["x1"].as_f64().unwrap() as usize,
                d["y1"].as_f64().unwrap() as usize,
                d["x2"].as_f64().unwrap() as usize,
            );
            // The middle of the top edge carries a saturated box colour (JPEG blurs it a bit);
            // the original there is whatever the street was.
            let [r, g, b] = px(&drawn, (x1 + x2) / 2, y1 + 1);
            let spread = r.max(g).max(b) - r.min(g).min(b);
            assert!(
                spread > 90,
                "{}: box edge at frame {frame} is drawn: {:?} (was {:?})",
                file.display(),
                [r, g, b],
                px(&original, (x1 + x2) / 2, y1 + 1)
            );
            boxes_checked += 1;
        }
    }
    assert!(boxes_checked > 0, "the frames hold people to draw");
}

#[test]
fn results_without_a_picture_are_refused_by_validate() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames_subset(tmp.path(), "cam", 0..2);
    let text = pipeline(&frames, "{ annotate: { dir: annotated } }")
        .replace("[camera_id, frame, path,", "[camera_id, frame,");
    let file = write(tmp.path(), "nopicture.yaml", &text);
    // `validate` catches it, naming the sink's line and what would do.
    let out = riffle(&["validate", file.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("sink.annotate")
            && stderr.contains("`path`")
            && stderr.contains("nopicture.yaml:"),
        "{stderr}"
    );
}
