use super::ops::row_major_gemm;
use super::*;

/// The arguments given to cuBLAS compute the row-major product for every transpose
/// combination (checked against the CPU executor's Gemm).
#[test]
fn gemm_arguments_give_the_row_major_product() {
    let (m, k, n) = (3, 4, 5);
    let a: Vec<f32> = (0..m * k).map(|v| v as f32 * 0.5 - 2.0).collect();
    let b: Vec<f32> = (0..k * n).map(|v| (v % 7) as f32 - 3.0).collect();
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        // Row-major A is m×k (k×m stored when transposed), B k×n (n×k when transposed).
        let (a_shape, b_shape) = (
            if ta { vec![k, m] } else { vec![m, k] },
            if tb { vec![n, k] } else { vec![k, n] },
        );
        let graph_gemm = |x: &Tensor, y: &Tensor| -> Vec<f32> {
            let node = crate::inference::dense::proto::NodeProto {
                input: vec!["a".into(), "b".into()],
                output: vec!["c".into()],
                op_type: "Gemm".into(),
                attribute: vec![
                    crate::inference::dense::proto::AttributeProto {
                        name: "transA".into(),
                        i: i64::from(ta),
                        ..Default::default()
                    },
                    crate::inference::dense::proto::AttributeProto {
                        name: "transB".into(),
                        i: i64::from(tb),
                        ..Default::default()
                    },
                ],
            };
            let graph = DenseGraph {
                nodes: vec![node],
                weights: HashMap::new(),
                split: HashMap::new(),
                inputs: vec!["a".into(), "b".into()],
                outputs: vec!["c".into()],
                input_specs: Vec::new(),
                output_specs: Vec::new(),
            };
            let out = graph
                .run_cpu(&[("a", x.clone()), ("b", y.clone())])
                .unwrap();
            out[0].as_f32().unwrap().to_vec()
        };
        let expected = graph_gemm(
            &Tensor::f32(a_shape, a.clone()),
            &Tensor::f32(b_shape, b.clone()),
        );
        let cfg = row_major_gemm("Gemm", m, k, n, ta, tb, 1.0).unwrap();
        let mut c = vec![0f32; m * n];
        // As the executor calls it: B's buffer first.
        sgemm_reference(&cfg, &b, &a, &mut c);
        assert_eq!(c, expected, "transA {ta}, transB {tb}");
    }
}

/// Where NVRTC is installed (a GPU host, or the `nvidia-cuda-nvrtc` wheel on the library
/// path), the kernels compile; elsewhere the executor refuses to start with a reason.
#[test]
fn kernels_compile_where_nvrtc_is_present() {
    // SAFETY: only tries to dlopen the NVRTC library by its usual names.
    riffle_gpu::expect_nvrtc_where_asked();
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        let ptx = cudarc::nvrtc::compile_ptx(KERNEL_SET.source)
            .unwrap()
            .to_src();
        for name in KERNEL_SET.names {
            assert!(ptx.contains(&format!(".entry {name}(")), "{name} missing");
        }
    } else {
        let e = KERNEL_SET.compile(0).err().expect("compiled without NVRTC");
        assert!(e.to_string().contains("NVRTC"), "{e}");
    }
    if let Err(why) = riffle_gpu::discover() {
        let graph = DenseGraph {
            nodes: Vec::new(),
            weights: HashMap::new(),
            split: HashMap::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            input_specs: Vec::new(),
            output_specs: Vec::new(),
        };
        let e = CudaDense::new(graph, 0).err().expect("no GPU here");
        assert!(e.to_string().contains(&why), "{e}");
    }
}

// The kernels executed on the CPU (riffle_gpu::emulator): `KERNELS` compiled by g++ and
// launched by the executor itself (`Dense`, which `CudaDense` runs) on an emulated
// `Device` (`riffle_gpu::emulated`), with cuBLAS's part done on the host by
// `sgemm_reference`; the results compared with the CPU executor's.

use crate::inference::dense::proto::{AttributeProto, NodeProto};
use riffle_gpu::emulated::{sgemm_reference, Emulated};
use riffle_gpu::emulator::Emulator;

/// `CudaDense::with_tables_on` with `table_devices` emulated table devices.
fn emulated_dense(
    emulator: &Emulator,
    graph: DenseGraph,
    table_devices: usize,
) -> DataflowResult<Dense<Emulated<'_>>> {
    let parts = if table_devices > 1 {
        (0..table_devices)
            .map(|_| Emulated::new(emulator, KERNEL_SET.stage))
            .collect()
    } else {
        Vec::new()
    };
    Dense::new(graph, Emulated::new(emulator, KERNEL_SET.stage), parts)
}

/// Deterministic values in ±[0.25, 4.25): no zero divisors, both signs.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let v = 0.25 + (state >> 40) as f32 / (1u64 << 24) as f32 * 4.0;
            if state & 1 == 0 {
                v
            } else {
                -v
            }
        })
        .collect()
}

fn random(shape: &[usize], seed: u64) -> Tensor {
    Tensor::f32(shape.to_vec(), values(shape.iter().product(), seed))
}

fn int_attr(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        i,
        ..Default::default()
    }
}

fn ints_attr(name: &str, ints: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        ints: ints.to_vec(),
        ..Default::default()
    }
}

/// One node reading `inputs` (graph inputs named `x0`, `x1`, ...).
struct Case {
    label: String,
    node: NodeProto,
    inputs: Vec<Tensor>,
}

impl Case {
    fn new(label: String, op: &str, attribute: Vec<AttributeProto>, inputs: Vec<Tensor>) -> Case {
        let node = NodeProto {
            input: (0..inputs.len()).map(|i| format!("x{i}")).collect(),
            output: vec!["y".into()],
            op_type: op.into(),
            attribute,
        };
        Case {
            label,
            node,
            inputs,
        }
    }

    fn graph(&self) -> DenseGraph {
        DenseGraph {
            nodes: vec![self.node.clone()],
            weights: HashMap::new(),
            split: HashMap::new(),
            inputs: self.node.input.clone(),
            outputs: vec!["y".into()],
            input_specs: Vec::new(),
            output_specs: Vec::new(),
        }
    }

    /// The emulated kernels' output against the CPU executor's: `Err` says how they differ.
    fn check(&self, emulator: &Emulator) -> Result<(), String> {
        let names = self.graph().inputs;
        let inputs: Vec<(&str, Tensor)> = names
            .iter()
            .map(String::as_str)
            .zip(self.inputs.iter().cloned())
            .collect();
        let expected = self.graph().run_cpu(&inputs).unwrap().remove(0);
        let got = emulated_dense(emulator, self.graph(), 1)
            .and_then(|dense| dense.run(&inputs))
            .map_err(|e| format!("{}: {e}", self.label))?
            .remove(0);
        same(&self.label, &got, &expected)
    }
}

/// Equal shapes, values within 2e-6 of the larger of 1 and the expected value (the CPU
/// executor's matrix products sum in blocks, the emulated cuBLAS in order: a few ulps apart).
fn same(label: &str, got: &Tensor, expected: &Tensor) -> Result<(), String> {
    if got.shape != expected.shape {
        return Err(format!(
            "{label}: shape {:?}, expected {:?}",
            got.shape, expected.shape
        ));
    }
    let (g, e) = (got.as_f32().unwrap(), expected.as_f32().unwrap());
    for (i, (x, y)) in g.iter().zip(e).enumerate() {
        if !((x - y).abs() <= 2e-6 * y.abs().max(1.0) || (x.is_nan() && y.is_nan())) {
            return Err(format!("{label}: element {i} is {x}, expected {y}"));
        }
    }
    Ok(())
}

fn check_all(emulator: &Emulator, cases: &[Case]) {
    for case in cases {
        case.check(emulator).unwrap();
    }
}

fn gather_cases() -> Vec<Case> {
    // (table shape, index shape): totals around and past one 1024-thread block.
    let shapes: [(&[usize], &[usize]); 6] = [
        (&[7, 3, 5], &[2, 3]),
        (&[300, 7], &[13, 17]),
        (&[2000, 1], &[1500]),
        (&[5], &[4]),
        (&[4, 2], &[]),
        (&[9, 1, 1, 3], &[1, 11]),
    ];
    shapes
        .iter()
        .enumerate()
        .map(|(k, (table, idx))| {
            let rows = table[0] as u64;
            let n: usize = idx.iter().product();
            let mut state = 0x5851_f42d_4c95_7f2du64 + k as u64;
            let indices: Vec<i64> = (0..n)
                .map(|_| {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    let row = ((state >> 33) % rows) as i64;
                    // Some negative (from the end, as ONNX allows): the host wraps them.
                    if state >> 62 == 0 {
                        row - rows as i64
                    } else {
                        row
                    }
                })
                .collect();
            Case::new(
                format!("Gather {table:?}[{idx:?}]"),
                "Gather",
                Vec::new(),
                vec![random(table, k as u64), Tensor::i64(idx.to_vec(), indices)],
            )
        })
        .collect()
}

fn binary_cases() -> Vec<Case> {
    let pairs: [(&[usize], &[usize]); 9] = [
        (&[2, 1, 3, 1], &[1, 4, 1, 5]),
        (&[1, 4, 1, 5], &[2, 1, 3, 1]),
        (&[3, 1, 7], &[5, 1]),
        (&[37, 29], &[29]),
        (&[37, 29], &[37, 1]),
        (&[1], &[2, 3, 4, 5]),
        (&[2, 3, 4, 5], &[2, 3, 4, 5]),
        (&[], &[33, 33]),
        (&[3, 1, 5, 1], &[3, 7, 1, 11]),
    ];
    let mut cases = Vec::new();
    for (k, (a, b)) in pairs.iter().enumerate() {
        for op in ["Add", "Sub", "Mul", "Div"] {
            cases.push(Case::new(
                format!("{op} {a:?} {b:?}"),
                op,
                Vec::new(),
                vec![random(a, 2 * k as u64), random(b, 2 * k as u64 + 1)],
            ));
        }
    }
    cases
}

fn unary_cases() -> Vec<Case> {
    let shapes: [&[usize]; 6] = [&[1], &[5], &[1023], &[1024], &[3, 7, 49], &[2049]];
    let mut cases = Vec::new();
    for (k, shape) in shapes.iter().enumerate() {
        for op in ["Relu", "Sigmoid"] {
            let mut x = random(shape, 40 + k as u64);
            if let Data::F32(v) = &mut x.data {
                // Saturating and signed-zero inputs too.
                for (slot, s) in v.iter_mut().zip([-100.0, 100.0, 0.0, -0.0, 20.0]) {
                    *slot = s;
                }
            }
            cases.push(Case::new(
                format!("{op} {shape:?}"),
                op,
                Vec::new(),
                vec![x],
            ));
        }
    }
    cases
}

fn reduce_cases() -> Vec<Case> {
    // (shape, axes, keepdims); axes empty: all of them.
    let cases: [(&[usize], &[i64], i64); 9] = [
        (&[], &[], 1),
        (&[], &[], 0),
        (&[3, 5, 7], &[2], 1),
        (&[3, 5, 7], &[1, 2], 0),
        (&[3, 5, 7], &[-1, -2], 1),
        (&[1500, 3], &[1], 0),
        (&[4, 1025], &[], 1),
        (&[1030, 1], &[1], 1),
        (&[2, 3, 1, 4], &[3], 0),
    ];
    let mut out = Vec::new();
    for (k, (shape, axes, keep)) in cases.iter().enumerate() {
        let x = random(shape, 60 + k as u64);
        // Axes as an attribute (opset < 13) and as a second input (opset ≥ 13).
        out.push(Case::new(
            format!("ReduceSum {shape:?} axes {axes:?} keepdims {keep}"),
            "ReduceSum",
            vec![ints_attr("axes", axes), int_attr("keepdims", *keep)],
            vec![x.clone()],
        ));
        if !axes.is_empty() {
            out.push(Case::new(
                format!("ReduceSum {shape:?} axes input {axes:?} keepdims {keep}"),
                "ReduceSum",
                vec![int_attr("keepdims", *keep)],
                vec![x, Tensor::i64(vec![axes.len()], axes.to_vec())],
            ));
        }
    }
    out
}

fn concat_cases() -> Vec<Case> {
    let cases: [(&[&[usize]], i64); 6] = [
        (&[&[2, 3, 4], &[2, 1, 4], &[2, 5, 4]], 1),
        (&[&[2, 3, 4], &[2, 3, 1], &[2, 3, 6]], -1),
        (&[&[1, 3], &[4, 3]], 0),
        (&[&[401, 3], &[401, 2], &[401, 1]], 1),
        (&[&[7], &[1100]], 0),
        (&[&[3, 2, 1, 5], &[3, 2, 2, 5]], 2),
    ];
    cases
        .iter()
        .enumerate()
        .map(|(k, (shapes, axis))| {
            Case::new(
                format!("Concat {shapes:?} axis {axis}"),
                "Concat",
                vec![int_attr("axis", *axis)],
                shapes
                    .iter()
                    .enumerate()
                    .map(|(j, s)| random(s, 80 + 10 * k as u64 + j as u64))
                    .collect(),
            )
        })
        .collect()
}

fn gemm_bias_cases() -> Vec<Case> {
    // The bias goes through binary_f32: a row, a column, a full matrix.
    let biases: [&[usize]; 4] = [&[5], &[1, 5], &[3, 1], &[3, 5]];
    biases
        .iter()
        .enumerate()
        .map(|(k, bias)| {
            Case::new(
                format!("Gemm with bias {bias:?}"),
                "Gemm",
                vec![int_attr("transB", 1)],
                vec![
                    random(&[3, 4], 100 + k as u64),
                    random(&[5, 4], 110 + k as u64),
                    random(bias, 120 + k as u64),
                ],
            )
        })
        .collect()
}

#[test]
fn emulated_gather_matches_the_cpu_executor() {
    check_all(
        &Emulator::shared(KERNEL_SET.source, KERNEL_SET.names),
        &gather_cases(),
    );
}

/// Indices past either end of the table stop the run before any kernel reads them.
#[test]
fn emulated_gather_rejects_indices_out_of_range() {
    let emulator = Emulator::shared(KERNEL_SET.source, KERNEL_SET.names);
    let table = random(&[7, 3], 1);
    for bad in [7, -8] {
        let case = Case::new(
            format!("Gather index {bad}"),
            "Gather",
            Vec::new(),
            vec![table.clone(), Tensor::i64(vec![3], vec![0, bad, 6])],
        );
        let inputs = [
            ("x0", case.inputs[0].clone()),
            ("x1", case.inputs[1].clone()),
        ];
        let e = emulated_dense(&emulator, case.graph(), 1)
            .and_then(|dense| dense.run(&inputs))
            .expect_err("out of range");
        assert!(e.to_string().contains("out of range"), "{e}");
    }
}

/// Runs `case` on a fresh emulated device: its error, and how many launches were queued.
fn refused(emulator: &Emulator, case: &Case) -> (String, usize) {
    let names: Vec<String> = (0..case.inputs.len()).map(|i| format!("x{i}")).collect();
    let inputs: Vec<(&str, Tensor)> = names
        .iter()
        .map(String::as_str)
        .zip(case.inputs.iter().cloned())
        .collect();
    let dense = emulated_dense(emulator, case.graph(), 1).unwrap();
    let e = match dense.run(&inputs) {
        Ok(out) => panic!("{}: ran, giving {out:?}", case.label),
        Err(e) => e.to_string(),
    };
    (e, dense.device.launches())
}

/// A tensor whose data does not match its shape (half its values missing) is refused before
/// any launch, as the CPU executor refuses it: every kernel would read past its buffer
/// (AddressSanitizer, which scripts/test.sh requires, would only report that afterwards).
#[test]
fn emulated_ops_refuse_data_that_does_not_match_its_shape_before_any_launch() {
    let emulator = Emulator::shared(KERNEL_SET.source, KERNEL_SET.names);
    let short = |shape: &[usize], seed: u64| {
        let mut t = random(shape, seed);
        if let Data::F32(v) = &mut t.data {
            v.truncate(v.len() / 2);
        }
        t
    };
    let cases = [
        Case::new("Relu".into(), "Relu", Vec::new(), vec![short(&[8], 1)]),
        Case::new(
            "Sigmoid".into(),
            "Sigmoid",
            Vec::new(),
            vec![short(&[3, 5], 2)],
        ),
        Case::new(
            "Add, first operand short".into(),
            "Add",
            Vec::new(),
            vec![short(&[4, 5], 3), random(&[4, 5], 4)],
        ),
        Case::new(
            "Mul, broadcast operand short".into(),
            "Mul",
            Vec::new(),
            vec![random(&[4, 6], 5), short(&[6], 6)],
        ),
        Case::new(
            "ReduceSum".into(),
            "ReduceSum",
            vec![ints_attr("axes", &[1])],
            vec![short(&[6, 7], 7)],
        ),
        Case::new(
            "Concat, second part short".into(),
            "Concat",
            vec![int_attr("axis", 1)],
            vec![random(&[3, 2], 8), short(&[3, 4], 9)],
        ),
        Case::new(
            "Gather, table short".into(),
            "Gather",
            Vec::new(),
            vec![short(&[7, 3], 10), Tensor::i64(vec![2], vec![0, 6])],
        ),
        Case::new(
            "MatMul, A short".into(),
            "MatMul",
            Vec::new(),
            vec![short(&[3, 4], 11), random(&[4, 5], 12)],
        ),
        Case::new(
            "MatMul, B short".into(),
            "MatMul",
            Vec::new(),
            vec![random(&[3, 4], 13), short(&[4, 5], 14)],
        ),
    ];
    for case in &cases {
        let (e, launches) = refused(&emulator, case);
        assert!(
            e.contains("does not match its shape"),
            "{}: {e}",
            case.label
        );
        assert_eq!(launches, 0, "{}: launched before refusing", case.label);
    }
}

/// Sizes past what a kernel's `int` indexes (2³¹ − 1 elements) are refused before any
/// buffer or launch, never wrapped into a launch over the wrong elements: an output of
/// 2³¹ + 65536 elements broadcast from small inputs, a Gather of as many, a tensor whose shape
/// claims as many, and a shape whose element count overflows.
#[test]
fn emulated_ops_refuse_sizes_past_2_31_before_any_launch() {
    let emulator = Emulator::shared(KERNEL_SET.source, KERNEL_SET.names);
    let past = (1usize << 31) + 8;
    let cases = [
        Case::new(
            "Add [65536, 1] + [1, 32769]".into(),
            "Add",
            Vec::new(),
            vec![random(&[65536, 1], 1), random(&[1, 32769], 2)],
        ),
        Case::new(
            "Gather of 32769 rows of 65536".into(),
            "Gather",
            Vec::new(),
            vec![
                random(&[2, 65536], 3),
                Tensor::i64(vec![32769], vec![1; 32769]),
            ],
        ),
        Case::new(
            format!("Relu of a [{past}] tensor"),
            "Relu",
            Vec::new(),
            vec![Tensor::f32(vec![past], values(8, 4))],
        ),
        Case::new(
            "Sigmoid of [2^40, 2^40]".into(),
            "Sigmoid",
            Vec::new(),
            vec![Tensor::f32(vec![1 << 40, 1 << 40], values(8, 5))],
        ),
    ];
    for case in &cases {
        let (e, launches) = refused(&emulator, case);
        assert!(
            e.contains(&format!("at most {}", i32::MAX)) || e.contains("overflows"),
            "{}: {e}",
            case.label
        );
        assert_eq!(launches, 0, "{}: launched before refusing", case.label);
    }
}

#[test]
fn emulated_binary_ops_match_the_cpu_executor_with_broadcasting() {
    let emulator = Emulator::shared(KERNEL_SET.source, KERNEL_SET.names);
    check_all(&emulator, &binary_cases());
    check_all(&emulator, &gemm_bias_cases());
}

#[test]
fn emulated_relu_and_sigmoid_match_the_cpu_executor() {
    check_all(
        &Emulator::shared(KERNEL_SET.source, KERNEL_SET.names),
        &unary_cases(),
    );
}

#[test]
fn emulated_reduce_sum_matches_the_cpu_executor() {
    check_all(
        &Emulator::shared(KERNEL_SET.source, KERNEL_SET.names),
        &reduce_cases(),
    );
}

#[test]
fn emulated_concat_matches_the_cpu_executor() {
    check_all(
        &Emulator::shared(KERNEL_SET.source, KERNEL_SET.names),
        &concat_cases(),
    );
}

/// The bundled CTR model end to end, its tables whole and split over 3 devices.
#[test]
fn emulated_kernels_run_the_ctr_model_like_the_cpu_executor() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/ml100k_ncf_ctr.onnx");
    let emulator = Emulator::shared(KERNEL_SET.source, KERNEL_SET.names);
    let n = 1500;
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = |m: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % m) as i64 + 1
    };
    let users: Vec<i64> = (0..n).map(|_| next(943)).collect();
    let items: Vec<i64> = (0..n).map(|_| next(1682)).collect();
    let inputs = [
        ("user_id", Tensor::i64(vec![n], users)),
        ("item_id", Tensor::i64(vec![n], items)),
    ];
    let graph = || DenseGraph::load(&path).unwrap();
    let expected = graph().run_cpu(&inputs).unwrap();
    for parts in [1, 3] {
        let got = emulated_dense(&emulator, graph(), parts)
            .and_then(|dense| dense.run(&inputs))
            .unwrap();
        assert_eq!(got.len(), expected.len());
        for (g, e) in got.iter().zip(&expected) {
            same(&format!("CTR model, {parts} table part(s)"), g, e).unwrap();
        }
    }
}

/// Each test above fails for a wrong index, stride or bound: in every mutant of `KERNELS`
/// below, each changed kernel makes some case of its own differ from the CPU executor or
/// fault. (The cases launch one kernel each, so one compile covers a change per kernel.)
#[test]
fn emulated_tests_catch_broken_kernels() {
    type Mutation = (&'static str, &'static str, fn() -> Vec<Case>);
    let indices: [Mutation; 5] = [
        (
            "data[idx[r] * width + c]",
            "data[idx[c] * width + r]",
            gather_cases,
        ),
        ("i2 * sa2 + i3 * sa3", "i2 * sa3 + i3 * sa2", binary_cases),
        (
            "op == 0 ? fmaxf(v, 0.0f)",
            "op == 1 ? fmaxf(v, 0.0f)",
            unary_cases,
        ),
        (
            "acc += x[t * inner + j]",
            "acc += x[t + j * outer]",
            reduce_cases,
        ),
        (
            "dst[o * dst_chunk + offset + c]",
            "dst[o * chunk + offset + c]",
            concat_cases,
        ),
    ];
    // Bounds one off and a wrong extent: threads read or write outside the buffers.
    let bounds: [Mutation; 5] = [
        (
            "if (t >= total) return;\n    int r",
            "if (t > total) return;\n    int r",
            gather_cases,
        ),
        (
            "int i1 = r % d1; int i0 = r / d1;",
            "int i1 = r % d2; int i0 = r / d2;",
            binary_cases,
        ),
        ("if (t >= n) return;", "if (t > n) return;", unary_cases),
        (
            "if (t >= outer) return;",
            "if (t > outer) return;",
            reduce_cases,
        ),
        (
            "if (t >= outer * chunk) return;",
            "if (t >= outer * dst_chunk) return;",
            concat_cases,
        ),
    ];
    for mutations in [indices, bounds] {
        let mut source = KERNEL_SET.source.to_string();
        for (from, to, _) in &mutations {
            assert_eq!(
                source.matches(from).count(),
                1,
                "`{from}` not in KERNEL_SET.source once"
            );
            source = source.replace(from, to);
        }
        let mutant = Emulator::new(&source, KERNEL_SET.names);
        for (from, to, cases) in mutations {
            let caught = cases().iter().any(|c| c.check(&mutant).is_err());
            assert!(caught, "replacing `{from}` by `{to}` went unnoticed");
        }
    }
}
