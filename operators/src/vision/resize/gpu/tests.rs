use std::path::Path;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, UInt32Type, UInt8Type};
use arrow_array::{Array, ArrayRef, BinaryArray, RecordBatch};
use riffle_dataflow::tensor::tensor_values;
use riffle_dataflow::{DataflowError, Stage};
use riffle_gpu::DeviceSpec;

use super::super::check::{image_batch, max_diff};
use super::super::reference::{as_f32, reference_tensor, resize_rgb8};
use super::super::{compare_on_gpu, Resize};
use super::*;
use crate::vision::decode::{Decode, DecodeConfig, HEIGHT_COLUMN, WIDTH_COLUMN};

fn config(width: u32, height: u32, layout: Layout, dtype: TensorDtype) -> ResizeConfig {
    let f32_only = |v: [f32; 3]| (dtype == TensorDtype::F32).then_some(v);
    ResizeConfig {
        input: "pixels".to_string(),
        output: "tensor".to_string(),
        width,
        height,
        layout,
        dtype,
        mean: f32_only([0.485, 0.456, 0.406]),
        std: f32_only([0.229, 0.224, 0.225]),
        scale: None,
        offset: None,
        mode: crate::vision::resize::ResizeMode::Stretch,
        antialias: Some(true),
        pad_value: 114,
        keep_input: false,
        device: DeviceSpec::Cpu,
    }
}

/// The CPU stage's tensor (as f32) for `images`.
fn cpu_stage(config: &ResizeConfig, images: &[(Vec<u8>, u32, u32)]) -> Vec<f32> {
    let mut stage = Resize::new(config.clone()).unwrap();
    let batch = image_batch(config, images).unwrap();
    let (values, _) = timed_once(&mut stage, config, &batch);
    values
}

fn timed_once(stage: &mut Resize, config: &ResizeConfig, batch: &RecordBatch) -> (Vec<f32>, usize) {
    let out = stage.process_batch(batch).unwrap();
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    let column = out.records.column_by_name(&config.output).unwrap();
    let values = match config.dtype {
        TensorDtype::F32 => tensor_values::<Float32Type>(column.as_ref())
            .unwrap()
            .to_vec(),
        TensorDtype::U8 => tensor_values::<UInt8Type>(column.as_ref())
            .unwrap()
            .iter()
            .map(|&p| f32::from(p))
            .collect(),
    };
    (values, out.records.num_rows())
}

/// Deterministic noise with some smooth structure, so both edges and gradients are hit.
fn synthetic(w: u32, h: u32, seed: u32) -> (Vec<u8>, u32, u32) {
    let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    let mut px = Vec::with_capacity(w as usize * h as usize * 3);
    for y in 0..h {
        for x in 0..w {
            for c in 0..3u32 {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                let smooth = (x * 7 + y * 3 + c * 50) % 256;
                let v = if (x + y + c) % 5 == 0 {
                    state >> 24
                } else {
                    smooth
                };
                px.push(v as u8);
            }
        }
    }
    (px, w, h)
}

/// Decoded bundled frames (640x272 JPEGs), a spread of the sequence.
fn frames() -> Vec<(Vec<u8>, u32, u32)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/frames/bikes");
    let jpegs: Vec<Vec<u8>> = [0, 61, 125, 190, 249]
        .iter()
        .map(|i| std::fs::read(dir.join(format!("{i:04}.jpg"))).unwrap())
        .collect();
    let batch = RecordBatch::try_from_iter(vec![(
        "bytes",
        Arc::new(BinaryArray::from_iter_values(jpegs.iter())) as ArrayRef,
    )])
    .unwrap();
    let out = Decode::new(DecodeConfig::default())
        .process_batch(&batch)
        .unwrap();
    assert!(out.rejected.is_empty());
    let pixels = out
        .records
        .column_by_name("pixels")
        .unwrap()
        .as_binary::<i32>();
    let size = |name: &str| {
        out.records
            .column_by_name(name)
            .unwrap()
            .as_primitive::<UInt32Type>()
            .clone()
    };
    let (widths, heights) = (size(WIDTH_COLUMN), size(HEIGHT_COLUMN));
    (0..pixels.len())
        .map(|i| (pixels.value(i).to_vec(), widths.value(i), heights.value(i)))
        .collect()
}

/// Largest difference between the reference and the CPU stage, in tensor units.
fn reference_vs_stage(config: &ResizeConfig, images: &[(Vec<u8>, u32, u32)]) -> f32 {
    let reference = reference_tensor(config, images).unwrap();
    let stage = cpu_stage(config, images);
    max_diff(&reference, &stage).unwrap()
}

#[test]
fn taps_of_a_halving_match_the_hand_computed_ones() {
    // 4 → 2: support 2 source pixels around centres 1.0 and 3.0; weights 0.25, 0.75,
    // 0.75 (and mirrored) over 1.75, in the largest precision that keeps 0.43 in i16.
    let taps = Taps::bilinear(4, 2);
    assert_eq!(taps.starts, [0, 1]);
    assert_eq!(taps.counts, [3, 3]);
    assert_eq!(taps.precision, 16);
    let unit = f64::from(1 << 16);
    let w = |v: f64| (v / 1.75 * unit).round() as i32;
    assert_eq!(
        taps.weights,
        [w(0.75), w(0.75), w(0.25), w(0.25), w(0.75), w(0.75)]
    );
    // The same size is the identity.
    let same = Taps::bilinear(5, 5);
    assert_eq!(same.starts, [0, 1, 2, 3, 4]);
    assert_eq!(same.counts, [1; 5]);
    assert!(same.weights.iter().all(|&w| w == 1 << same.precision));
    assert!(Taps::bilinear(0, 3).is_empty());
}

#[test]
fn reference_matches_fast_image_resize_on_frames() {
    let frames = frames();
    assert_eq!((frames[0].1, frames[0].2), (640, 272));
    let cases = [
        config(224, 224, Layout::Nchw, TensorDtype::F32),
        config(320, 180, Layout::Nhwc, TensorDtype::F32),
        config(97, 61, Layout::Nchw, TensorDtype::U8),
        config(1000, 400, Layout::Nhwc, TensorDtype::U8),
    ];
    for c in &cases {
        let diff = reference_vs_stage(c, &frames);
        // Exact: same taps, same fixed point, same pass order as fast_image_resize.
        assert_eq!(
            diff, 0.0,
            "{}x{} {:?} {:?}",
            c.width, c.height, c.layout, c.dtype
        );
    }
}

/// (source, target): down, up, mixed per axis, one axis unchanged, odd and tiny sizes.
const SYNTHETIC_SIZES: [((u32, u32), (u32, u32)); 12] = [
    ((1, 1), (3, 5)),
    ((2, 2), (1, 1)),
    ((7, 3), (2, 9)),
    ((17, 13), (4, 4)),
    ((33, 31), (64, 62)),
    ((3, 200), (7, 7)),
    ((199, 2), (33, 1)),
    ((64, 48), (64, 17)),
    ((50, 40), (13, 40)),
    ((31, 31), (31, 31)),
    ((1280, 3), (5, 3)),
    ((101, 77), (224, 224)),
];

#[test]
fn reference_matches_fast_image_resize_on_synthetic_sizes() {
    let sizes = SYNTHETIC_SIZES;
    for (i, ((sw, sh), (dw, dh))) in sizes.into_iter().enumerate() {
        let images = vec![
            synthetic(sw, sh, i as u32),
            synthetic(sw, sh, 100 + i as u32),
        ];
        for layout in [Layout::Nchw, Layout::Nhwc] {
            for dtype in [TensorDtype::F32, TensorDtype::U8] {
                let c = config(dw, dh, layout, dtype);
                let diff = reference_vs_stage(&c, &images);
                assert_eq!(diff, 0.0, "{sw}x{sh} -> {dw}x{dh} {layout:?} {dtype:?}");
            }
        }
    }
    // Rows of different sizes in one batch.
    let mixed = vec![
        synthetic(40, 30, 1),
        synthetic(9, 70, 2),
        synthetic(300, 5, 3),
    ];
    let c = config(16, 12, Layout::Nchw, TensorDtype::F32);
    assert_eq!(reference_vs_stage(&c, &mixed), 0.0);
}

#[test]
fn resize_rgb8_checks_its_input() {
    assert!(resize_rgb8(&[0; 5], 1, 2, 3, 3).is_err());
    assert!(resize_rgb8(&[0; 6], 1, 2, 0, 3).is_err());
    assert_eq!(resize_rgb8(&[9; 6], 1, 2, 2, 1).unwrap(), [9; 6]);
}

#[test]
fn on_gpu_fails_cleanly_without_that_gpu() {
    // No machine has GPU usize::MAX; without CUDA at all this must not panic either.
    let c = config(8, 8, Layout::Nchw, TensorDtype::F32);
    match Resize::on_gpu(c.clone(), usize::MAX).map_err(crate::unlocated) {
        Err(DataflowError::Config(msg)) => assert!(msg.contains("cuda:"), "{msg}"),
        Err(other) => panic!("expected a config error, got {other}"),
        Ok(_) => panic!("a stage on a GPU that does not exist"),
    }
    assert!(matches!(
        compare_on_gpu(&c, &[synthetic(4, 4, 0)], usize::MAX).map_err(crate::unlocated),
        Err(DataflowError::Config(_))
    ));
    assert!(matches!(
        compare_on_gpu(&c, &[(vec![1, 2], 4, 4)], 0),
        Err(DataflowError::Config(_))
    ));
}

#[test]
fn packer_lays_images_back_to_back_and_keeps_taps() {
    let images = [synthetic(5, 4, 1), synthetic(7, 4, 2), synthetic(5, 4, 3)];
    let refs: Vec<(&[u8], u32, u32)> = images.iter().map(|i| (i.0.as_slice(), i.1, i.2)).collect();
    let mut packer = Packer::new(3, 2);
    let packed = packer.pack(&refs).unwrap();
    assert!(packed.taps_changed);
    assert_eq!(packed.tmp_len, 2 * 3 * (5 + 7 + 5));
    assert_eq!(packed.max_vertical, 2 * 3 * 7);
    assert_eq!(packer.pixels.len(), 3 * (20 + 28 + 20));
    let meta: Vec<&[i64]> = packer.meta.chunks(META).collect();
    // Source and temp offsets, widths; one height and two widths: three cached axes.
    assert_eq!(
        meta.iter().map(|m| [m[0], m[1], m[2]]).collect::<Vec<_>>(),
        [[0, 5, 0], [60, 7, 30], [144, 5, 72]]
    );
    assert_eq!(meta[0][3..], meta[2][3..]);
    assert_eq!(meta[0][3..6], meta[1][3..6]);
    assert_eq!((packer.rows.len(), packer.cols.len()), (1, 2));
    // The same sizes again: nothing new to upload.
    assert!(!packer.pack(&refs).unwrap().taps_changed);
    assert!(packer.pack(&[(&[0u8; 5], 1, 1)]).is_err());
}

/// NVRTC needs no GPU: wherever its library is installed, the kernels must compile.
#[test]
fn kernels_compile_where_nvrtc_is_present() {
    // SAFETY: only tries to dlopen the NVRTC library by its usual names.
    riffle_gpu::expect_nvrtc_where_asked();
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        // Without NVRTC the GPU stage must refuse to build, with a reason, not panic.
        let c = config(8, 8, Layout::Nchw, TensorDtype::F32);
        match Resize::on_gpu(c, 0).map_err(crate::unlocated) {
            Err(DataflowError::Config(msg)) => {
                assert!(msg.contains("cuda:0") || msg.contains("NVRTC"), "{msg}")
            }
            Err(other) => panic!("expected a config error, got {other}"),
            Ok(_) => panic!("a GPU resize stage without NVRTC"),
        }
        return;
    }
    let ptx = cudarc::nvrtc::compile_ptx(KERNEL_SET.source)
        .unwrap()
        .to_src();
    for name in KERNEL_SET.names {
        assert!(ptx.contains(&format!(".entry {name}(")), "{name} missing");
    }
}

/// Where no GPU is usable, checks that the stage says why instead.
#[test]
fn gpu_matches_the_reference_when_a_gpu_is_present() {
    if let Err(why) = riffle_gpu::discover() {
        let c = config(8, 8, Layout::Nchw, TensorDtype::F32);
        match Resize::on_gpu(c, 0).map_err(crate::unlocated) {
            Err(DataflowError::Config(msg)) => assert!(msg.contains(&why), "{msg}"),
            Err(other) => panic!("expected a config error, got {other}"),
            Ok(_) => panic!("a GPU resize stage without a GPU"),
        }
        return;
    }
    let mut images = frames();
    images.extend([synthetic(33, 31, 7), synthetic(3, 200, 8)]);
    for (layout, dtype) in [
        (Layout::Nchw, TensorDtype::F32),
        (Layout::Nhwc, TensorDtype::U8),
    ] {
        let c = config(224, 160, layout, dtype);
        let check = compare_on_gpu(&c, &images, 0).unwrap();
        assert_eq!(check.max_diff_vs_reference, 0.0, "{check:?}");
        assert_eq!(check.max_diff_vs_cpu_stage, 0.0, "{check:?}");
    }
    // Bad rows still go to the dead letters, with the same schema out.
    let c = config(16, 16, Layout::Nchw, TensorDtype::F32);
    let good = synthetic(20, 10, 1);
    let rows = vec![
        (vec![1, 2, 3], 4, 2),
        good.clone(),
        (Vec::new(), 0, 0),
        good,
    ];
    let batch = image_batch(&c, &rows).unwrap();
    let mut gpu = Resize::on_gpu(c.clone(), 0).unwrap();
    let mut cpu = Resize::new(c).unwrap();
    let (g, c) = (
        gpu.process_batch(&batch).unwrap(),
        cpu.process_batch(&batch).unwrap(),
    );
    assert_eq!(g.records.schema(), c.records.schema());
    assert_eq!(g.records.num_rows(), 2);
    let reasons = |o: &riffle_dataflow::StageOutput| -> Vec<String> {
        o.rejected.iter().map(|d| d.reason.clone()).collect()
    };
    assert_eq!(reasons(&g), reasons(&c));
    assert_eq!(g.records.column(2).to_data(), c.records.column(2).to_data());
}

// The kernels executed on the CPU (riffle_gpu::emulator): `KERNEL_SET.source` compiled by g++ and
// launched by `CudaResize` itself on an emulated `GpuDevice` (`riffle_gpu::emulated`),
// compared with `reference_tensor` (exactly).

use riffle_gpu::emulated::Emulated;
use riffle_gpu::emulator::Emulator;

/// `CudaResize::new` on an emulated GPU, with the `Resize` stage's table as
/// `Resize::on_gpu` passes it, and at most `max_grid_y` images per launch. New buffers are
/// poisoned: they stand for what an earlier batch left in a reused buffer.
fn emulated_resize<'e>(
    emulator: &'e Emulator,
    config: &ResizeConfig,
    max_grid_y: usize,
) -> CudaResize<Emulated<'e>> {
    let stage = Resize::new(config.clone()).unwrap();
    let device = Emulated::new(emulator, STAGE).poisoned();
    let mut resize = CudaResize::on(device, config, stage.lut()).unwrap();
    resize.max_grid_y = max_grid_y;
    resize
}

/// The emulated kernels' tensor for `images` against [`reference_tensor`]: `Err` says
/// where they first differ.
fn emulated_vs_reference(
    resize: &mut CudaResize<Emulated>,
    config: &ResizeConfig,
    images: &[(Vec<u8>, u32, u32)],
) -> Result<(), String> {
    let what = format!(
        "{}x{} {:?} {:?}, {} image(s), {} per launch",
        config.width,
        config.height,
        config.layout,
        config.dtype,
        images.len(),
        resize.max_grid_y
    );
    let refs: Vec<(&[u8], u32, u32)> = images.iter().map(|i| (i.0.as_slice(), i.1, i.2)).collect();
    let got = as_f32(resize.run(&refs).map_err(|e| format!("{what}: {e}"))?);
    let expected = reference_tensor(config, images).unwrap();
    if got.len() != expected.len() {
        return Err(format!(
            "{what}: {} values, expected {}",
            got.len(),
            expected.len()
        ));
    }
    // Exact: the kernels do the reference's integer arithmetic and table look-up.
    match got.iter().zip(&expected).position(|(g, e)| g != e) {
        None => Ok(()),
        Some(i) => {
            let per_image = 3 * config.width as usize * config.height as usize;
            Err(format!(
                "{what}: image {}, element {} is {}, expected {}",
                i / per_image,
                i % per_image,
                got[i],
                expected[i]
            ))
        }
    }
}

fn emulated_check(
    emulator: &Emulator,
    config: &ResizeConfig,
    images: &[(Vec<u8>, u32, u32)],
    max_grid_y: usize,
) -> Result<(), String> {
    let mut resize = emulated_resize(emulator, config, max_grid_y);
    emulated_vs_reference(&mut resize, config, images)
}

const LAYOUTS_AND_DTYPES: [(Layout, TensorDtype); 4] = [
    (Layout::Nchw, TensorDtype::F32),
    (Layout::Nhwc, TensorDtype::F32),
    (Layout::Nchw, TensorDtype::U8),
    (Layout::Nhwc, TensorDtype::U8),
];

#[test]
fn emulated_kernels_match_the_reference_on_frames() {
    let emulator = Emulator::shared(KERNEL_SET.source, KERNEL_SET.names);
    let frames = frames();
    let cases = [
        config(224, 224, Layout::Nchw, TensorDtype::F32),
        config(320, 180, Layout::Nhwc, TensorDtype::F32),
        config(97, 61, Layout::Nchw, TensorDtype::U8),
        config(1000, 400, Layout::Nhwc, TensorDtype::U8),
        config(224, 160, Layout::Nhwc, TensorDtype::F32),
        config(224, 160, Layout::Nchw, TensorDtype::U8),
    ];
    for c in &cases {
        emulated_check(&emulator, c, &frames, MAX_GRID_Y).unwrap();
    }
    // One image per launch: every launch but the first has `image_base` > 0.
    let c = config(61, 97, Layout::Nchw, TensorDtype::F32);
    emulated_check(&emulator, &c, &frames, 1).unwrap();
}

#[test]
fn emulated_kernels_match_the_reference_on_synthetic_sizes() {
    let emulator = Emulator::shared(KERNEL_SET.source, KERNEL_SET.names);
    let sizes = SYNTHETIC_SIZES;
    for (i, ((sw, sh), (dw, dh))) in sizes.into_iter().enumerate() {
        let images = vec![
            synthetic(sw, sh, i as u32),
            synthetic(sw, sh, 100 + i as u32),
        ];
        for (k, (layout, dtype)) in LAYOUTS_AND_DTYPES.into_iter().enumerate() {
            let c = config(dw, dh, layout, dtype);
            // Half the cases one image per launch.
            let per_launch = if (i + k) % 2 == 0 { MAX_GRID_Y } else { 1 };
            emulated_check(&emulator, &c, &images, per_launch).unwrap();
        }
    }
    // Sizes mixed in one batch (per-image offsets and taps), in launches of 2 images.
    let mixed = vec![
        synthetic(40, 30, 1),
        synthetic(9, 70, 2),
        synthetic(300, 5, 3),
        synthetic(40, 7, 4),
        synthetic(1, 1, 5),
    ];
    for (layout, dtype) in LAYOUTS_AND_DTYPES {
        for per_launch in [MAX_GRID_Y, 2] {
            let c = config(16, 12, layout, dtype);
            emulated_check(&emulator, &c, &mixed, per_launch).unwrap();
        }
    }
}

/// One stage over successive batches: buffers grown then reused with stale contents,
/// taps cached, appended to, and dropped when [`MAX_CACHED_SIZES`] is passed.
#[test]
fn emulated_kernels_match_the_reference_batch_after_batch() {
    let emulator = Emulator::shared(KERNEL_SET.source, KERNEL_SET.names);
    let first = vec![
        synthetic(64, 48, 1),
        synthetic(33, 31, 2),
        synthetic(64, 48, 3),
    ];
    // More than MAX_CACHED_SIZES source widths and heights: the next batch starts over.
    let many: Vec<(Vec<u8>, u32, u32)> = (1..=260u32)
        .map(|k| synthetic(k, 1, k))
        .chain((2..=260u32).map(|k| synthetic(1, k, k)))
        .collect();
    let batches = [
        first.clone(),
        vec![synthetic(5, 4, 4)],
        vec![synthetic(33, 31, 5), synthetic(70, 9, 6)],
        many,
        first,
        vec![synthetic(200, 150, 7)],
    ];
    for (layout, dtype) in LAYOUTS_AND_DTYPES {
        let c = config(24, 18, layout, dtype);
        let mut resize = emulated_resize(&emulator, &c, MAX_GRID_Y);
        for (i, batch) in batches.iter().enumerate() {
            emulated_vs_reference(&mut resize, &c, batch)
                .unwrap_or_else(|e| panic!("batch {i}: {e}"));
        }
        assert!(resize.host.rows.len() + resize.host.cols.len() <= MAX_CACHED_SIZES);
    }
}

/// Each test above fails for a wrong index, stride or bound: every mutant of `KERNEL_SET.source`
/// below makes some case differ from the reference or fault (each change is caught by the
/// cases of the dtype given with it; changes to different horizontal kernels share one
/// compile, as a case launches only one of them).
#[test]
fn emulated_tests_catch_broken_resize_kernels() {
    let images = vec![
        synthetic(17, 13, 1),
        synthetic(7, 3, 2),
        synthetic(33, 31, 3),
    ];
    let mutants: [&[(&str, &str, TensorDtype)]; 3] = [
        // The vertical pass stepping by a pixel instead of a row.
        &[(
            "ss += (int)p[j * row_len] * w[j];",
            "ss += (int)p[j * 3] * w[j];",
            TensorDtype::U8,
        )],
        // The channel's table ignored; the launch's first image taken as the batch's.
        &[
            ("lut[c * 256 + p]", "lut[p]", TensorDtype::F32),
            (
                "out[(long long)image * per_image + t] =\n        horizontal(",
                "out[(long long)blockIdx.y * per_image + t] =\n        horizontal(",
                TensorDtype::U8,
            ),
        ],
        // Threads past an image's rows writing into the next image's.
        &[(
            "if (t >= dst_h * row_len) return;",
            "if (t >= dst_h * row_len + 3) return;",
            TensorDtype::F32,
        )],
    ];
    for mutations in mutants {
        let mut source = KERNEL_SET.source.to_string();
        for (from, to, _) in mutations {
            assert_eq!(
                source.matches(from).count(),
                1,
                "`{from}` not in KERNEL_SET.source once"
            );
            source = source.replace(from, to);
        }
        let mutant = Emulator::new(&source, KERNEL_SET.names);
        for (from, to, dtype) in mutations {
            let caught = [Layout::Nchw, Layout::Nhwc].into_iter().any(|layout| {
                let c = config(9, 7, layout, *dtype);
                emulated_check(&mutant, &c, &images, 2).is_err()
            });
            assert!(caught, "replacing `{from}` by `{to}` went unnoticed");
        }
    }
}

/// The tensor a worker of an (emulated) one-GPU host gives for `config` and `images`, placed
/// as the stage kind places it (`device: auto` resolves to cuda:0 here), and how many kernel
/// launches the GPU saw.
fn on_a_gpu_host(
    emulator: &Emulator,
    config: &ResizeConfig,
    images: &[(Vec<u8>, u32, u32)],
) -> (Vec<f32>, usize) {
    match config.placement(|_| Ok(Some(0))).unwrap() {
        Some(_) => {
            let mut resize = emulated_resize(emulator, config, MAX_GRID_Y);
            let refs: Vec<(&[u8], u32, u32)> =
                images.iter().map(|i| (i.0.as_slice(), i.1, i.2)).collect();
            let values = as_f32(resize.run(&refs).unwrap());
            (values, resize.device.launches())
        }
        None => (cpu_stage(config, images), 0),
    }
}

#[test]
fn auto_on_an_emulated_gpu_host_keeps_letterbox_and_two_tap_resizes_on_the_cpu() {
    let emulator = Emulator::shared(KERNEL_SET.source, KERNEL_SET.names);
    // Wider than tall, so that a letterbox pads; shrunk, so that two taps differ from the
    // antialiased kernels.
    let images = vec![synthetic(90, 40, 1), synthetic(90, 40, 2)];
    let auto = |mode, antialias| ResizeConfig {
        mode,
        antialias,
        device: DeviceSpec::Auto,
        ..config(32, 32, Layout::Nchw, TensorDtype::U8)
    };
    use crate::vision::resize::ResizeMode::{Letterbox, Stretch};
    // What the kernels do runs on them, and gives the CPU stage's tensor.
    let stretch = auto(Stretch, None);
    let (gpu, launches) = on_a_gpu_host(&emulator, &stretch, &images);
    assert!(launches > 0, "the antialiased stretch runs on the GPU");
    assert_eq!(gpu, cpu_stage(&stretch, &images));
    // A letterbox (two-tap by default) and a two-tap stretch: the CPU's tensor, no launch.
    for config in [auto(Letterbox, None), auto(Stretch, Some(false))] {
        let (got, launches) = on_a_gpu_host(&emulator, &config, &images);
        assert_eq!(launches, 0, "{:?} {:?}", config.mode, config.antialias);
        assert_eq!(got, cpu_stage(&config, &images));
        // …which is not what the stretch kernels would have given.
        assert_ne!(got, gpu, "{:?} {:?}", config.mode, config.antialias);
    }
}
