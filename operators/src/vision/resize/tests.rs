use super::*;
use arrow_array::{BinaryArray, FixedSizeListArray, Int64Array};
use riffle_dataflow::tensor::{row_shape, tensor_values};

fn config(width: u32, height: u32) -> ResizeConfig {
    ResizeConfig {
        input: "pixels".to_string(),
        output: "tensor".to_string(),
        width,
        height,
        layout: Layout::default(),
        dtype: TensorDtype::default(),
        mean: None,
        std: None,
        scale: None,
        offset: None,
        mode: ResizeMode::Stretch,
        antialias: Some(true),
        pad_value: 114,
        keep_input: false,
        device: DeviceSpec::Cpu,
    }
}

/// A batch of (frame id, RGB8 pixels, width, height) rows.
fn batch_of(rows: Vec<(Vec<u8>, u32, u32)>) -> RecordBatch {
    let ids: Vec<i64> = (0..rows.len() as i64).collect();
    let pixels: Vec<&[u8]> = rows.iter().map(|r| r.0.as_slice()).collect();
    RecordBatch::try_from_iter(vec![
        ("frame", Arc::new(Int64Array::from(ids)) as ArrayRef),
        ("pixels", Arc::new(BinaryArray::from(pixels)) as ArrayRef),
        (
            "width",
            Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| r.1))) as ArrayRef,
        ),
        (
            "height",
            Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| r.2))) as ArrayRef,
        ),
    ])
    .unwrap()
}

/// 4×2 image: R steps across columns (0,0,255,255), G steps down rows (40 then 80),
/// B is flat 128.
fn image_4x2() -> Vec<u8> {
    let mut px = Vec::new();
    for g in [40u8, 80] {
        for r in [0u8, 0, 255, 255] {
            px.extend([r, g, 128]);
        }
    }
    px
}

#[test]
fn resizes_and_normalises_nchw_f32() {
    let mean = [0.485, 0.456, 0.406];
    let std = [0.229, 0.224, 0.225];
    let mut stage = Resize::new(ResizeConfig {
        mean: Some(mean),
        std: Some(std),
        ..config(2, 1)
    })
    .unwrap();
    let batch = batch_of(vec![(image_4x2(), 4, 2)]);
    let out = stage.process_batch(&batch).unwrap();
    assert!(out.rejected.is_empty());
    let schema = out.records.schema();
    let names: Vec<_> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["frame", "width", "height", "tensor"]);
    assert_eq!(row_shape(schema.field(3)).unwrap(), vec![3, 1, 2]);
    let got = tensor_values::<Float32Type>(out.records.column(3).as_ref()).unwrap();

    // Bilinear (triangle) convolution, 2× down: support 2 src px around each output
    // centre. Output x=0 (centre 1.0) weighs src columns 0,1,2 by 0.75,0.75,0.25 (sum
    // 1.75): R = 255*0.25/1.75 = 36.43 → 36; x=1 mirrors it: R = 255*1.5/1.75 = 218.57
    // → 219. Vertically both rows weigh the same: G = (40+80)/2 = 60. B stays 128.
    let pixel = [[36.43f32, 218.57], [60.0, 60.0], [128.0, 128.0]];
    for c in 0..3 {
        for x in 0..2 {
            let want = (pixel[c][x] / 255.0 - mean[c]) / std[c];
            let v = got[c * 2 + x];
            // One u8 step of rounding in the resizer, normalised.
            let tolerance = 1.0 / 255.0 / std[c];
            assert!(
                (v - want).abs() <= tolerance,
                "channel {c} x {x}: got {v}, want {want}"
            );
        }
    }
}

#[test]
fn without_antialiasing_each_output_pixel_blends_its_two_nearest_source_pixels() {
    // OpenCV's INTER_LINEAR, 2× down: output x=0 (centre 0.5 in source pixels) is the mean
    // of columns 0 and 1, x=1 of columns 2 and 3, whatever lies further out. Antialiased,
    // the same image gives 36 and 219 (see above): columns 0..2 all count.
    let mut stage = Resize::new(ResizeConfig {
        antialias: Some(false),
        ..config(2, 1)
    })
    .unwrap();
    let mut px = Vec::new();
    for r in [0u8, 100, 200, 255] {
        px.extend([r, r, r]);
    }
    let out = stage.process_batch(&batch_of(vec![(px, 4, 1)])).unwrap();
    let got = tensor_values::<Float32Type>(out.records.column(3).as_ref()).unwrap();
    for c in 0..3 {
        let (left, right) = (got[c * 2] * 255.0, got[c * 2 + 1] * 255.0);
        assert!((left - 50.0).abs() <= 1.0, "channel {c}: {left}");
        assert!((right - 227.5).abs() <= 1.0, "channel {c}: {right}");
    }
}

#[test]
fn antialias_false_is_refused_on_a_gpu_before_any_device_is_touched() {
    let e = Resize::on_gpu(
        ResizeConfig {
            antialias: Some(false),
            ..config(2, 1)
        },
        0,
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(e.contains("antialias: false runs on the CPU only"), "{e}");
}

#[test]
fn plain_f32_is_pixel_over_255_and_same_size_is_a_copy() {
    let mut stage = Resize::new(config(4, 2)).unwrap();
    let out = stage
        .process_batch(&batch_of(vec![(image_4x2(), 4, 2)]))
        .unwrap();
    let got = tensor_values::<Float32Type>(out.records.column(3).as_ref()).unwrap();
    let src = image_4x2();
    let want: Vec<f32> = (0..3)
        .flat_map(|c| src.iter().skip(c).step_by(3).map(|&p| p as f32 / 255.0))
        .collect();
    assert_eq!(got, want.as_slice());
}

#[test]
fn nhwc_u8_shape_and_values() {
    let mut stage = Resize::new(ResizeConfig {
        layout: Layout::Nhwc,
        dtype: TensorDtype::U8,
        keep_input: true,
        ..config(4, 3)
    })
    .unwrap();
    let flat = [10u8, 20, 30].repeat(8 * 6);
    let batch = batch_of(vec![(flat.clone(), 8, 6), (flat, 8, 6)]);
    let out = stage.process_batch(&batch).unwrap();
    let schema = out.records.schema();
    let field = schema.field_with_name("tensor").unwrap();
    assert_eq!(row_shape(field).unwrap(), vec![3, 4, 3]);
    assert_eq!(
        field.data_type(),
        &DataType::FixedSizeList(Arc::new(Field::new_list_field(DataType::UInt8, false)), 36)
    );
    assert!(schema.field_with_name("pixels").is_ok());
    let column = out.records.column_by_name("tensor").unwrap();
    assert_eq!(
        column
            .as_any()
            .downcast_ref::<FixedSizeListArray>()
            .unwrap()
            .len(),
        2
    );
    let got = tensor_values::<UInt8Type>(column.as_ref()).unwrap();
    assert_eq!(got, [10u8, 20, 30].repeat(2 * 12).as_slice());
}

#[test]
fn bad_rows_go_to_dead_letters() {
    let mut stage = Resize::new(config(2, 1)).unwrap();
    let batch = batch_of(vec![
        (vec![1, 2, 3], 4, 2),
        (image_4x2(), 4, 2),
        (Vec::new(), 0, 0),
    ]);
    let out = stage.process_batch(&batch).unwrap();
    assert_eq!(out.records.num_rows(), 1);
    let frame = out
        .records
        .column(0)
        .as_primitive::<arrow_array::types::Int64Type>();
    assert_eq!(frame.value(0), 1);
    assert_eq!(out.rejected.len(), 2);
    assert_eq!(
        out.rejected[0].record,
        r#"{"frame":0,"width":4,"height":2}"#
    );
    assert!(out.rejected[0].reason.contains("expected 24"));
    assert!(out.rejected[1].reason.contains("empty image"));
    let got = tensor_values::<Float32Type>(out.records.column(3).as_ref()).unwrap();
    assert_eq!(got.len(), 6);
}

#[test]
fn new_rejects_bad_configs() {
    let u8_with_mean = ResizeConfig {
        dtype: TensorDtype::U8,
        mean: Some([0.5; 3]),
        ..config(2, 2)
    };
    assert!(matches!(
        Resize::new(u8_with_mean).map_err(crate::unlocated),
        Err(DataflowError::Config(_))
    ));
    assert!(Resize::new(config(0, 2)).is_err());
    assert!(Resize::new(ResizeConfig {
        std: Some([0.2, 0.0, 0.2]),
        ..config(2, 2)
    })
    .is_err());
    assert!(Resize::new(config(2, 2)).is_ok());
}

#[test]
fn output_schema_names_missing_or_mistyped_columns() {
    let stage = Resize::new(config(2, 2)).unwrap();
    let schema = |fields: Vec<Field>| Arc::new(Schema::new(fields));
    let pixels = Field::new("pixels", DataType::Binary, false);
    let width = Field::new("width", DataType::UInt32, false);
    let height = Field::new("height", DataType::UInt32, false);
    let column_of = |s: SchemaRef| match stage.output_schema(&s).map_err(crate::unlocated) {
        Err(DataflowError::Schema { column, .. }) => column,
        other => panic!("expected a schema error, got {other:?}"),
    };
    assert_eq!(
        column_of(schema(vec![width.clone(), height.clone()])),
        "pixels"
    );
    assert_eq!(
        column_of(schema(vec![pixels.clone(), height.clone()])),
        "width"
    );
    assert_eq!(
        column_of(schema(vec![
            pixels.clone(),
            width.clone(),
            Field::new("height", DataType::Int64, false),
        ])),
        "height"
    );
    assert!(stage
        .output_schema(&schema(vec![pixels, width, height]))
        .is_ok());
}

#[test]
fn config_parses_lowercase_enums() {
    use serde::de::value::{Error, MapDeserializer};
    use serde::Deserialize;
    let pairs = [("layout", "nhwc"), ("dtype", "u8")];
    let de = MapDeserializer::<_, Error>::new(pairs.into_iter());
    // width/height are required: the error names the first missing one.
    let err = ResizeConfig::deserialize(de).unwrap_err().to_string();
    assert!(err.contains("width"), "{err}");
    let layout: Layout =
        Layout::deserialize(serde::de::value::StrDeserializer::<Error>::new("nhwc")).unwrap();
    assert_eq!(layout, Layout::Nhwc);
    let dtype: TensorDtype =
        TensorDtype::deserialize(serde::de::value::StrDeserializer::<Error>::new("f32")).unwrap();
    assert_eq!(dtype, TensorDtype::F32);
}

#[test]
fn letterbox_fits_ultralytics_rounding() {
    // A 640×272 frame into 640×640: unscaled, 368 rows of padding split evenly.
    assert_eq!(
        letterbox_fit((640, 272), (640, 640)),
        LetterboxFit {
            gain: 1.0,
            inner: (640, 272),
            left: 0,
            top: 184
        }
    );
    // An odd padding puts the extra pixel below: 3 rows over 1 → top 1.
    let fit = letterbox_fit((4, 1), (2, 2));
    assert_eq!(
        (fit.gain, fit.inner, fit.left, fit.top),
        (0.5, (2, 1), 0, 0)
    );
    let fit = letterbox_fit((2, 1), (2, 4));
    assert_eq!((fit.inner, fit.top), ((2, 1), 1));
}

#[test]
fn letterbox_pads_around_the_unscaled_image_and_reports_the_fit() {
    let mut stage = Resize::new(ResizeConfig {
        mode: ResizeMode::Letterbox,
        antialias: Some(true),
        pad_value: 114,
        dtype: TensorDtype::U8,
        layout: Layout::Nhwc,
        ..config(4, 4)
    })
    .unwrap();
    let out = stage
        .process_batch(&batch_of(vec![(image_4x2(), 4, 2)]))
        .unwrap();
    let tensor = out.records.column_by_name("tensor").unwrap();
    let values = tensor_values::<UInt8Type>(tensor).unwrap();
    // Row 0 and row 3 are padding; rows 1 and 2 are the image, unchanged.
    assert_eq!(&values[..12], &[114u8; 12]);
    assert_eq!(&values[12..36], &image_4x2()[..]);
    assert_eq!(&values[36..], &[114u8; 12]);
    let fit = out.records.column_by_name(LETTERBOX_COLUMN).unwrap();
    assert_eq!(tensor_values::<Float32Type>(fit).unwrap(), [1.0, 0.0, 1.0]);
}

#[test]
fn letterbox_scales_down_keeping_the_aspect_ratio() {
    let mut stage = Resize::new(ResizeConfig {
        mode: ResizeMode::Letterbox,
        dtype: TensorDtype::U8,
        layout: Layout::Nhwc,
        ..config(2, 2)
    })
    .unwrap();
    let out = stage
        .process_batch(&batch_of(vec![(image_4x2(), 4, 2)]))
        .unwrap();
    let values = tensor_values::<UInt8Type>(out.records.column_by_name("tensor").unwrap())
        .unwrap()
        .to_vec();
    // Half size: the 2×1 image on row 0 (the odd padding row goes below), grey row 1.
    assert_eq!(&values[6..], &[114u8; 6]);
    assert_ne!(&values[..6], &[114u8; 6]);
    let fit = out.records.column_by_name(LETTERBOX_COLUMN).unwrap();
    assert_eq!(tensor_values::<Float32Type>(fit).unwrap(), [0.5, 0.0, 0.0]);
}

#[test]
fn scale_and_offset_normalise_raw_pixels() {
    let mut stage = Resize::new(ResizeConfig {
        scale: Some(PerChannel::All(1.0 / 128.0)),
        offset: Some(PerChannel::Rgb([127.5, 127.5, 127.5])),
        ..config(4, 2)
    })
    .unwrap();
    let out = stage
        .process_batch(&batch_of(vec![(image_4x2(), 4, 2)]))
        .unwrap();
    let values = tensor_values::<Float32Type>(out.records.column_by_name("tensor").unwrap())
        .unwrap()
        .to_vec();
    // The R plane's first pixel is 0, the B plane's 128.
    assert_eq!(values[0], -127.5 / 128.0);
    assert_eq!(values[16], 0.5 / 128.0);
    // Both forms at once is an error at `scale`.
    let e = Resize::new(ResizeConfig {
        scale: Some(PerChannel::All(2.0)),
        mean: Some([0.5; 3]),
        ..config(4, 2)
    })
    .err()
    .unwrap();
    assert!(e.to_string().contains("scale"), "{e}");
}

/// A config as the YAML block `json` gives it (unset keys take their defaults).
fn parsed(json: serde_json::Value) -> ResizeConfig {
    serde_json::from_value(json).unwrap()
}

#[test]
fn a_letterbox_resizes_as_opencv_by_default_and_a_stretch_antialiases() {
    let letterbox = parsed(serde_json::json!({
        "width": 8, "height": 8, "mode": "letterbox", "dtype": "u8", "layout": "nhwc",
    }));
    assert!(!letterbox.antialiased());
    let stretch = parsed(serde_json::json!({ "width": 8, "height": 8 }));
    assert!(stretch.antialiased());
    let explicit = parsed(serde_json::json!({
        "width": 8, "height": 8, "mode": "letterbox", "antialias": true,
    }));
    assert!(explicit.antialiased());

    // 16×8 of stripes into an 8×8 letterbox: the 8×4 inner image is OpenCV's two-tap resize
    // (pixel 0 of each output pair is the mean of two source columns), padded with 114.
    let mut px = Vec::new();
    for _ in 0..8 {
        for x in 0..16u8 {
            px.extend([x * 16, 255 - x * 16, 7]);
        }
    }
    let out = Resize::new(letterbox)
        .unwrap()
        .process_batch(&batch_of(vec![(px.clone(), 16, 8)]))
        .unwrap();
    let values = tensor_values::<UInt8Type>(out.records.column_by_name("tensor").unwrap())
        .unwrap()
        .to_vec();
    let mut inner = vec![0u8; 8 * 4 * 3];
    two_tap::TwoTap::default()
        .resize(&px, (16, 8), &mut inner, (8, 4))
        .unwrap();
    // Rows 2..6 of the 8×8 canvas hold the image; the first row of it blends columns 0, 1.
    assert_eq!(&values[2 * 24..6 * 24], &inner[..]);
    assert_eq!(&values[..2 * 24], &[114u8; 48]);
    assert_eq!(
        values[2 * 24],
        8,
        "(0 + 16) / 2: two taps, not a wider average"
    );
    // Antialiased, the first output pixel also weighs column 2 (and so is not 8).
    let mut antialiased = Resize::new(ResizeConfig {
        antialias: Some(true),
        mode: ResizeMode::Letterbox,
        dtype: TensorDtype::U8,
        layout: Layout::Nhwc,
        ..config(8, 8)
    })
    .unwrap();
    let out = antialiased
        .process_batch(&batch_of(vec![(px, 16, 8)]))
        .unwrap();
    let values = tensor_values::<UInt8Type>(out.records.column_by_name("tensor").unwrap())
        .unwrap()
        .to_vec();
    assert_ne!(&values[2 * 24..6 * 24], &inner[..]);
}

/// The key a located error is at.
fn key_of(e: &DataflowError) -> String {
    e.located().0.unwrap_or_default().to_string()
}

#[test]
fn cuda_with_a_resize_the_kernels_cannot_do_is_an_error_at_its_key_before_any_gpu_is_looked_for() {
    let looked = std::cell::Cell::new(false);
    let resolve = |_: &DeviceSpec| {
        looked.set(true);
        Ok(Some(0))
    };
    let letterbox = parsed(serde_json::json!({
        "width": 8, "height": 8, "mode": "letterbox", "device": "cuda:0",
    }));
    let e = letterbox.placement(resolve).unwrap_err();
    assert_eq!(key_of(&e), "mode");
    assert!(
        e.to_string()
            .contains("mode letterbox runs on the CPU only"),
        "{e}"
    );
    let two_tap = parsed(serde_json::json!({
        "width": 8, "height": 8, "antialias": false, "device": "cuda:1",
    }));
    let e = two_tap.placement(resolve).unwrap_err();
    assert_eq!(key_of(&e), "antialias");
    assert!(e.to_string().contains("`device: cuda:1`"), "{e}");
    assert!(!looked.get(), "no GPU is looked for");
    // What the kernels do passes on to the GPU the device names.
    let stretch = parsed(serde_json::json!({ "width": 8, "height": 8, "device": "cuda:0" }));
    assert_eq!(stretch.placement(resolve).unwrap(), Some(0));
}

#[test]
fn auto_on_a_gpu_host_runs_what_the_kernels_cannot_do_on_the_cpu() {
    // A host with one GPU: `auto` resolves to cuda:0.
    let gpu_host = |_: &DeviceSpec| Ok(Some(0));
    for json in [
        serde_json::json!({ "width": 8, "height": 8, "mode": "letterbox", "device": "auto" }),
        serde_json::json!({ "width": 8, "height": 8, "antialias": false, "device": "auto" }),
    ] {
        let config = parsed(json.clone());
        assert_eq!(config.placement(gpu_host).unwrap(), None, "{json}");
        assert!(!crate::StageKind::may_use_gpu(&config), "{json}");
    }
    let stretch = parsed(serde_json::json!({ "width": 8, "height": 8, "device": "auto" }));
    assert_eq!(stretch.placement(gpu_host).unwrap(), Some(0));
    assert!(crate::StageKind::may_use_gpu(&stretch));
    // A resolution error (e.g. no such GPU) is still reported, at `device`.
    let e = stretch
        .placement(|_: &DeviceSpec| Err("no GPU".to_string()))
        .unwrap_err();
    assert_eq!(key_of(&e), "device");
}

/// `batch` with its pixel column marked as scaled to `size` by the source.
fn prescaled(batch: RecordBatch, size: (u32, u32)) -> RecordBatch {
    let schema = batch.schema();
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| match f.name().as_str() {
            "pixels" => riffle_formats::picture::with_pixels_size(f.as_ref().clone(), size),
            _ => f.as_ref().clone(),
        })
        .collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), batch.columns().to_vec()).unwrap()
}

#[test]
fn pixels_a_source_scaled_to_the_target_are_laid_out_as_they_are_and_keep_the_picture_size() {
    // A 640x272 picture whose pixels the video source already scaled to 2x1.
    let scaled = vec![10u8, 20, 30, 40, 50, 60];
    let batch = prescaled(
        batch_of(vec![(scaled.clone(), 640, 272), (vec![1u8; 9], 640, 272)]),
        (2, 1),
    );
    let mut stage = Resize::new(ResizeConfig {
        dtype: TensorDtype::U8,
        ..config(2, 1)
    })
    .unwrap();
    let out = stage.process_batch(&batch).unwrap();
    assert_eq!(out.records.num_rows(), 1);
    let tensor = out.records.column_by_name("tensor").unwrap();
    // NCHW: the R plane, then G, then B; no resampling.
    assert_eq!(
        tensor_values::<UInt8Type>(tensor).unwrap(),
        [10, 40, 20, 50, 30, 60]
    );
    let width = out.records.column_by_name("width").unwrap();
    assert_eq!(width.as_primitive::<UInt32Type>().value(0), 640);
    // The 9-byte row is not the 2x1 the field says: a dead letter naming that size.
    assert_eq!(out.rejected.len(), 1);
    assert!(
        out.rejected[0].reason.contains("2x1"),
        "{}",
        out.rejected[0].reason
    );

    // Scaled to another size than the stage's: resized from that size, not the picture's.
    let four_by_two = prescaled(batch_of(vec![(image_4x2(), 640, 272)]), (4, 2));
    let out = stage.process_batch(&four_by_two).unwrap();
    let direct = stage
        .process_batch(&batch_of(vec![(image_4x2(), 4, 2)]))
        .unwrap();
    let values = |b: &RecordBatch| {
        tensor_values::<UInt8Type>(b.column_by_name("tensor").unwrap())
            .unwrap()
            .to_vec()
    };
    assert_eq!(values(&out.records), values(&direct.records));
}
