use super::*;
use arrow_array::{Int64Array, StringArray};
use std::path::Path;

fn sample_jpeg() -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/frames/bikes/0000.jpg");
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn batch_of(payloads: Vec<Option<&[u8]>>) -> RecordBatch {
    let ids: Vec<i64> = (0..payloads.len() as i64).collect();
    RecordBatch::try_from_iter(vec![
        ("frame", Arc::new(Int64Array::from(ids)) as ArrayRef),
        ("bytes", Arc::new(BinaryArray::from(payloads)) as ArrayRef),
    ])
    .unwrap()
}

fn png_of(
    width: u32,
    height: u32,
    color: png::ColorType,
    depth: png::BitDepth,
    data: &[u8],
) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut out, width, height);
        encoder.set_color(color);
        encoder.set_depth(depth);
        let mut writer = encoder.write_header().unwrap();
        writer.write_image_data(data).unwrap();
    }
    out
}

#[test]
fn decodes_png_of_every_colour_type_to_rgb() {
    // 2×1: RGBA, grey+alpha and 16-bit RGB versions of a red and a grey pixel.
    let rgba = png_of(
        2,
        1,
        png::ColorType::Rgba,
        png::BitDepth::Eight,
        &[255, 0, 0, 9, 7, 7, 7, 255],
    );
    let grey = png_of(
        2,
        1,
        png::ColorType::GrayscaleAlpha,
        png::BitDepth::Eight,
        &[200, 1, 7, 2],
    );
    let deep = png_of(
        2,
        1,
        png::ColorType::Rgb,
        png::BitDepth::Sixteen,
        &[255, 255, 0, 0, 0, 0, 7, 0, 7, 0, 7, 0],
    );
    let batch = batch_of(vec![
        Some(&rgba),
        Some(&grey),
        Some(&deep),
        Some(&rgba[..20]),
    ]);
    let mut stage = Decode::new(DecodeConfig::default());
    let out = stage.process_batch(&batch).unwrap();
    let pixels = out
        .records
        .column_by_name("pixels")
        .unwrap()
        .as_binary::<i32>();
    assert_eq!(pixels.value(0), &[255, 0, 0, 7, 7, 7]);
    assert_eq!(pixels.value(1), &[200, 200, 200, 7, 7, 7]);
    assert_eq!(pixels.value(2), &[255, 0, 0, 7, 7, 7]);
    assert_eq!(out.rejected.len(), 1, "the truncated PNG");
    assert!(
        out.rejected[0].reason.contains("invalid PNG"),
        "{:?}",
        out.rejected
    );
}

/// A lossless WebP of `pixels` (RGB8 or RGBA8 by `alpha`).
fn webp_of(width: u32, height: u32, alpha: bool, pixels: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let color = if alpha {
        image_webp::ColorType::Rgba8
    } else {
        image_webp::ColorType::Rgb8
    };
    image_webp::WebPEncoder::new(&mut out)
        .encode(pixels, width, height, color)
        .unwrap();
    out
}

#[test]
fn decodes_lossless_webp_exactly_with_alpha_dropped() {
    let rgb = webp_of(2, 1, false, &[255, 0, 0, 7, 8, 9]);
    let rgba = webp_of(2, 1, true, &[1, 2, 3, 4, 250, 251, 252, 0]);
    let batch = batch_of(vec![Some(&rgb), Some(&rgba), Some(&rgb[..rgb.len() - 3])]);
    let mut stage = Decode::new(DecodeConfig::default());
    let out = stage.process_batch(&batch).unwrap();
    let pixels = out
        .records
        .column_by_name("pixels")
        .unwrap()
        .as_binary::<i32>();
    assert_eq!(pixels.value(0), &[255, 0, 0, 7, 8, 9]);
    assert_eq!(pixels.value(1), &[1, 2, 3, 250, 251, 252]);
    assert_eq!(out.rejected.len(), 1, "the truncated WebP");
    assert!(
        out.rejected[0].reason.contains("invalid WebP"),
        "{:?}",
        out.rejected
    );
}

#[test]
fn a_png_claiming_too_many_pixels_is_refused_before_decoding() {
    let big = png_of(4, 4, png::ColorType::Rgb, png::BitDepth::Eight, &[0; 48]);
    let mut stage = Decode::new(DecodeConfig {
        max_pixels: 15,
        ..DecodeConfig::default()
    });
    let out = stage.process_batch(&batch_of(vec![Some(&big)])).unwrap();
    assert!(
        out.rejected[0].reason.contains("exceeds max_pixels (15)"),
        "{:?}",
        out.rejected
    );
}

#[test]
fn decodes_jpeg_and_rejects_broken_rows() {
    let good = sample_jpeg();
    let truncated = good[..1000].to_vec();
    // Cut inside the entropy-coded data: headers parse, the scan runs out.
    let cut_mid_scan = good[..good.len() * 2 / 3].to_vec();
    let batch = batch_of(vec![
        Some(&truncated),
        Some(&good),
        Some(b"not a jpeg"),
        Some(b""),
        None,
        Some(&cut_mid_scan),
    ]);
    let mut stage = Decode::new(DecodeConfig::default());
    let out = stage.process_batch(&batch).unwrap();

    assert_eq!(out.records.num_rows(), 1);
    assert_eq!(
        out.records.schema(),
        stage.output_schema(&batch.schema()).unwrap()
    );
    let names: Vec<_> = out
        .records
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, ["frame", "pixels", "width", "height"]);
    let frame = out
        .records
        .column(0)
        .as_primitive::<arrow_array::types::Int64Type>();
    assert_eq!(frame.value(0), 1);
    let width = out
        .records
        .column(2)
        .as_primitive::<arrow_array::types::UInt32Type>();
    let height = out
        .records
        .column(3)
        .as_primitive::<arrow_array::types::UInt32Type>();
    assert_eq!((width.value(0), height.value(0)), (640, 272));
    let pixels = out.records.column(1).as_binary::<i32>();
    assert_eq!(pixels.value(0).len(), 640 * 272 * 3);
    // A real photo is not one flat colour (guards against an all-grey "success").
    let px = pixels.value(0);
    assert!(px.iter().any(|&p| p != px[0]));

    let frames: Vec<_> = out.rejected.iter().map(|l| l.record.clone()).collect();
    assert_eq!(
        frames,
        [
            r#"{"frame":0}"#,
            r#"{"frame":2}"#,
            r#"{"frame":3}"#,
            r#"{"frame":4}"#,
            r#"{"frame":5}"#
        ]
    );
    for letter in &out.rejected {
        assert_eq!(letter.stage, "decode");
    }
    assert!(out.rejected[0].reason.starts_with("invalid JPEG: "));
    assert!(out.rejected[1].reason.starts_with("invalid JPEG: "));
    assert_eq!(out.rejected[2].reason, "empty image payload");
    assert_eq!(out.rejected[3].reason, "null image payload");
    assert!(out.rejected[4].reason.starts_with("invalid JPEG: "));
}

#[test]
fn keeps_input_and_reads_large_binary() {
    let good = sample_jpeg();
    let batch = RecordBatch::try_from_iter(vec![(
        "img",
        Arc::new(LargeBinaryArray::from(vec![Some(good.as_slice())])) as ArrayRef,
    )])
    .unwrap();
    let mut stage = Decode::new(DecodeConfig {
        input: "img".into(),
        output: "rgb".into(),
        keep_input: true,
        ..DecodeConfig::default()
    });
    let out = stage.process_batch(&batch).unwrap();
    assert!(out.rejected.is_empty());
    let schema = out.records.schema();
    let names: Vec<_> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["img", "rgb", "width", "height"]);
    assert_eq!(
        out.records.column(1).as_binary::<i32>().value(0).len(),
        640 * 272 * 3
    );
}

#[test]
fn grayscale_jpeg_comes_out_rgb() {
    let batch = batch_of(vec![Some(GRAY_8X8_JPEG)]);
    let out = Decode::new(DecodeConfig::default())
        .process_batch(&batch)
        .unwrap();
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    let pixels = out.records.column(1).as_binary::<i32>().value(0).to_vec();
    assert_eq!(pixels.len(), 8 * 8 * 3);
    for px in pixels.chunks_exact(3) {
        assert_eq!(px[0], px[1]);
        assert_eq!(px[1], px[2]);
    }
    let first_row: Vec<i32> = pixels[..24].iter().step_by(3).map(|&p| p as i32).collect();
    for (got, want) in first_row.iter().zip([0, 29, 60, 89, 120, 149, 180, 209]) {
        assert!((got - want).abs() <= 2, "{first_row:?}");
    }
}

#[test]
fn output_schema_checks_input_column() {
    let stage = Decode::new(DecodeConfig::default());
    let missing = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
    let err = crate::unlocated(stage.output_schema(&missing).unwrap_err());
    assert!(matches!(err, DataflowError::Schema { ref column, .. } if column == "bytes"));
    let wrong = Arc::new(Schema::new(vec![Field::new(
        "bytes",
        DataType::Utf8,
        false,
    )]));
    let err = crate::unlocated(stage.output_schema(&wrong).unwrap_err());
    assert!(matches!(err, DataflowError::Schema { ref column, .. } if column == "bytes"));

    let batch = RecordBatch::try_from_iter(vec![(
        "name",
        Arc::new(StringArray::from(vec!["a"])) as ArrayRef,
    )])
    .unwrap();
    assert!(Decode::new(DecodeConfig::default())
        .process_batch(&batch)
        .is_err());
}

/// `jpeg` with its frame header (SOF0..SOF2) claiming `width`×`height`.
fn forge_size(jpeg: &[u8], width: u16, height: u16) -> Vec<u8> {
    let mut forged = jpeg.to_vec();
    let sof = forged
        .windows(2)
        .position(|w| w[0] == 0xff && (0xc0..=0xc2).contains(&w[1]))
        .expect("a frame header");
    // Marker, length (2), precision (1), then height and width, big-endian.
    forged[sof + 5..sof + 7].copy_from_slice(&height.to_be_bytes());
    forged[sof + 7..sof + 9].copy_from_slice(&width.to_be_bytes());
    forged
}

#[test]
fn a_header_claiming_too_many_pixels_is_refused_before_decoding() {
    let good = sample_jpeg();
    let forged = forge_size(&good, 16384, 16384);
    assert!(forged.len() < 100_000);
    let mut rows: Vec<Option<&[u8]>> = Vec::new();
    for _ in 0..3 {
        rows.push(Some(&forged));
        rows.push(Some(&good));
    }
    let out = Decode::new(DecodeConfig::default())
        .process_batch(&batch_of(rows))
        .unwrap();
    assert_eq!(out.records.num_rows(), 3, "the good neighbours decode");
    let frames = out
        .records
        .column(0)
        .as_primitive::<arrow_array::types::Int64Type>();
    assert_eq!(frames.values(), &[1, 3, 5]);
    assert_eq!(out.rejected.len(), 3);
    for letter in &out.rejected {
        assert_eq!(
            letter.reason,
            "image of 16384x16384 (268435456 pixels) exceeds max_pixels (40000000)"
        );
    }
    // A lower limit refuses the real frame (640×272) too.
    let config = DecodeConfig {
        max_pixels: 640 * 272 - 1,
        ..DecodeConfig::default()
    };
    let out = Decode::new(config)
        .process_batch(&batch_of(vec![Some(&good)]))
        .unwrap();
    assert_eq!(out.records.num_rows(), 0);
    assert!(out.rejected[0].reason.contains("640x272"));
}

#[test]
fn a_batch_over_max_batch_bytes_asks_to_be_split_and_one_image_always_fits() {
    let good = sample_jpeg();
    let config = DecodeConfig {
        max_batch_bytes: 640 * 272 * 3 + 1,
        ..DecodeConfig::default()
    };
    let mut stage = Decode::new(config);
    let two = batch_of(vec![Some(&good), Some(&good)]);
    let err = stage.process_batch(&two).unwrap_err();
    assert!(matches!(err, DataflowError::BatchTooLarge { .. }), "{err}");
    let one = batch_of(vec![Some(&good)]);
    assert_eq!(stage.process_batch(&one).unwrap().records.num_rows(), 1);
    // Smaller than one image: still decoded alone.
    let mut tiny = Decode::new(DecodeConfig {
        max_batch_bytes: 1,
        ..DecodeConfig::default()
    });
    assert_eq!(tiny.process_batch(&one).unwrap().records.num_rows(), 1);
}

#[test]
fn limits_are_checked_at_validation() {
    let input = Arc::new(Schema::new(vec![Field::new(
        "bytes",
        DataType::Binary,
        false,
    )]));
    for (config, key) in [
        (
            DecodeConfig {
                max_pixels: 0,
                ..DecodeConfig::default()
            },
            "max_pixels",
        ),
        (
            DecodeConfig {
                max_pixels: 1 << 30,
                ..DecodeConfig::default()
            },
            "max_pixels",
        ),
        (
            DecodeConfig {
                max_batch_bytes: 1 << 31,
                ..DecodeConfig::default()
            },
            "max_batch_bytes",
        ),
    ] {
        let err = Decode::new(config).output_schema(&input).unwrap_err();
        assert_eq!(err.located().0, Some(key), "{err}");
    }
}

/// Deserialises a config from string pairs (no JSON crate among the dependencies).
fn config_from(pairs: &[(&str, &str)]) -> Result<DecodeConfig, serde::de::value::Error> {
    use serde::de::value::{Error, MapDeserializer};
    use serde::Deserialize;
    DecodeConfig::deserialize(MapDeserializer::<_, Error>::new(pairs.iter().copied()))
}

#[test]
fn config_defaults_and_rejects_unknown_fields() {
    let c = config_from(&[]).unwrap();
    assert_eq!((c.input.as_str(), c.output.as_str()), ("bytes", "pixels"));
    assert!(!c.keep_input);
    assert_eq!(config_from(&[("input", "jpeg")]).unwrap().input, "jpeg");
    assert!(config_from(&[("inptu", "jpeg")]).is_err());
}

/// An 8×8 single-component (grayscale) JPEG, written by Pillow; its first row decodes
/// (Pillow/libjpeg) to 0, 29, 60, 89, 120, 149, 180, 209.
#[rustfmt::skip]
const GRAY_8X8_JPEG: &[u8] = &[
    0xff, 0xd8, 0xff, 0xe0, 0x00, 0x10, 0x4a, 0x46, 0x49, 0x46, 0x00, 0x01,
    0x01, 0x00, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0xff, 0xdb, 0x00, 0x43,
    0x00, 0x03, 0x02, 0x02, 0x03, 0x02, 0x02, 0x03, 0x03, 0x03, 0x03, 0x04,
    0x03, 0x03, 0x04, 0x05, 0x08, 0x05, 0x05, 0x04, 0x04, 0x05, 0x0a, 0x07,
    0x07, 0x06, 0x08, 0x0c, 0x0a, 0x0c, 0x0c, 0x0b, 0x0a, 0x0b, 0x0b, 0x0d,
    0x0e, 0x12, 0x10, 0x0d, 0x0e, 0x11, 0x0e, 0x0b, 0x0b, 0x10, 0x16, 0x10,
    0x11, 0x13, 0x14, 0x15, 0x15, 0x15, 0x0c, 0x0f, 0x17, 0x18, 0x16, 0x14,
    0x18, 0x12, 0x14, 0x15, 0x14, 0xff, 0xc0, 0x00, 0x0b, 0x08, 0x00, 0x08,
    0x00, 0x08, 0x01, 0x01, 0x11, 0x00, 0xff, 0xc4, 0x00, 0x14, 0x00, 0x01,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x04, 0xff, 0xc4, 0x00, 0x1a, 0x10, 0x00, 0x00, 0x07,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x06, 0x09, 0x22, 0x35, 0x41, 0x52, 0xff, 0xda, 0x00, 0x08,
    0x01, 0x01, 0x00, 0x00, 0x3f, 0x00, 0x02, 0x77, 0x14, 0x63, 0x19, 0x9a,
    0x1f, 0xff, 0xd9,
];

#[test]
fn libjpeg_turbo_gives_opencvs_pixels_and_refuses_a_truncated_stream() {
    // fnv1a64 of `cv2.cvtColor(cv2.imdecode(f), cv2.COLOR_BGR2RGB).tobytes()` (cv2 5.0,
    // libjpeg-turbo 3.1): the Python peers' decoded frames.
    let cv2 = [
        ("0000", 0x0ca2_efe6_e5f5_1cfe_u64),
        ("0061", 0x5069_c366_6fc8_83da),
        ("0249", 0xc0d8_9464_31e3_20bc),
    ];
    let fnv1a64 = |data: &[u8]| {
        data.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        })
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/frames/bikes");
    let jpegs: Vec<Vec<u8>> = cv2
        .iter()
        .map(|(name, _)| std::fs::read(dir.join(format!("{name}.jpg"))).unwrap())
        .collect();
    let mut payloads: Vec<Option<&[u8]>> = jpegs.iter().map(|j| Some(j.as_slice())).collect();
    let truncated = &jpegs[0][..jpegs[0].len() / 2];
    payloads.push(Some(truncated));
    let config = DecodeConfig {
        input: "bytes".to_string(),
        jpeg: JpegLibrary::LibjpegTurbo,
        ..DecodeConfig::default()
    };
    let out = Decode::new(config)
        .process_batch(&batch_of(payloads.clone()))
        .unwrap();
    let pixels = out
        .records
        .column_by_name("pixels")
        .unwrap()
        .as_binary::<i32>();
    assert_eq!(pixels.len(), 3);
    for (i, (name, hash)) in cv2.iter().enumerate() {
        assert_eq!(fnv1a64(pixels.value(i)), *hash, "frame {name}");
    }
    assert_eq!(out.rejected.len(), 1);
    assert!(
        out.rejected[0].reason.starts_with("invalid JPEG"),
        "{}",
        out.rejected[0].reason
    );
    // zune-jpeg's pixels are not OpenCV's (what `jpeg: libjpeg-turbo` is for).
    let zune = Decode::new(DecodeConfig {
        input: "bytes".to_string(),
        ..DecodeConfig::default()
    })
    .process_batch(&batch_of(payloads))
    .unwrap();
    let zune_pixels = zune
        .records
        .column_by_name("pixels")
        .unwrap()
        .as_binary::<i32>();
    assert_ne!(fnv1a64(zune_pixels.value(0)), cv2[0].1);
}
