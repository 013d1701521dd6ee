use super::*;

#[test]
fn the_engine_follows_executor_device_and_what_is_installed() {
    let dense_ok: Result<(), String> = Ok(());
    let not_dense: Result<(), String> = Err("op `Conv` is not supported".into());
    use Engine::*;
    use Executor as X;
    let choose = |x, d: DeviceSpec, gpu, provider, dense: &Result<(), String>| {
        choose_engine(x, &d, gpu, provider, dense)
    };
    // No GPU for this stage.
    assert_eq!(
        choose(X::Auto, DeviceSpec::Cpu, None, true, &dense_ok),
        Ok(OrtCpu)
    );
    assert_eq!(
        choose(X::Ort, DeviceSpec::Auto, None, false, &not_dense),
        Ok(OrtCpu)
    );
    assert_eq!(
        choose(X::Dense, DeviceSpec::Cpu, None, false, &dense_ok),
        Ok(DenseCpu)
    );
    let e = choose(X::Dense, DeviceSpec::Cpu, None, false, &not_dense).unwrap_err();
    assert!(e.starts_with("executor `dense`: op `Conv`"), "{e}");
    // A GPU: ORT's CUDA provider first, then the dense executor.
    assert_eq!(
        choose(X::Auto, DeviceSpec::Cuda(1), Some(1), true, &not_dense),
        Ok(OrtCuda(1))
    );
    assert_eq!(
        choose(X::Auto, DeviceSpec::Cuda(1), Some(1), false, &dense_ok),
        Ok(DenseCuda(1))
    );
    assert_eq!(
        choose(X::Dense, DeviceSpec::Auto, Some(0), true, &dense_ok),
        Ok(DenseCuda(0))
    );
    assert_eq!(
        choose(X::Ort, DeviceSpec::Auto, Some(2), true, &dense_ok),
        Ok(OrtCuda(2))
    );
    let e = choose(X::Ort, DeviceSpec::Cuda(0), Some(0), false, &dense_ok).unwrap_err();
    assert!(
        e.starts_with("executor `ort` on cuda:0: ONNX Runtime's CUDA provider"),
        "{e}"
    );
    // Neither: `auto` falls back to CPU, `cuda:N` is an error naming both reasons.
    assert_eq!(
        choose(X::Auto, DeviceSpec::Auto, Some(0), false, &not_dense),
        Ok(OrtCpu)
    );
    let e = choose(X::Auto, DeviceSpec::Cuda(0), Some(0), false, &not_dense).unwrap_err();
    assert!(
        e.starts_with("device `cuda:0`: ") && e.contains("`Conv`"),
        "{e}"
    );
}

/// ONNX Runtime's environment; a test that needs it fails without it (never passes unrun),
/// saying how to install it.
fn onnx_runtime() -> ort::environment::Environment {
    onnx::environment().unwrap_or_else(|e| panic!("this test needs ONNX Runtime: {e}"))
}

/// The signature read from the protobuf is what ONNX Runtime reports, on every bundled model.
#[test]
fn signatures_read_from_the_file_agree_with_onnx_runtime() {
    let models = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models");
    let env = onnx_runtime();
    let mut read = 0;
    for entry in std::fs::read_dir(&models).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|x| x != "onnx") {
            continue;
        }
        let signature = Signature::read(&path).unwrap();
        let session = ort_io::open_session(&env, &path, 1, Engine::OrtCpu).unwrap();
        let ort = Signature {
            inputs: onnx::tensor_specs(session.inputs(), &path).unwrap(),
            outputs: onnx::tensor_specs(session.outputs(), &path).unwrap(),
        };
        assert_eq!(signature, ort, "{}", path.display());
        read += 1;
    }
    assert!(read >= 3, "{read} models");
}

/// The schema rule needs only the config and the signature; errors name their key.
#[test]
fn output_schema_from_the_signature_locates_errors_at_keys() {
    use arrow_schema::Schema;
    use riffle_dataflow::tensor::tensor_field;
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/ssdlite_person.onnx");
    let signature = Signature::read(&path).unwrap();
    let config = |column: &str| -> ModelConfig {
        serde_json::from_value(serde_json::json!({
            "path": path,
            "inputs": { "image_tensor:0": column },
            "outputs": { "num_detections:0": "n" },
        }))
        .unwrap()
    };
    let input: SchemaRef = std::sync::Arc::new(Schema::new(vec![
        tensor_field("u8", DataType::UInt8, &[300, 300, 3]),
        tensor_field("f32", DataType::Float32, &[300, 300, 3]),
    ]));
    let out = output_schema(&config("u8"), &signature, &input).unwrap();
    assert!(out.field_with_name("n").is_ok() && out.field_with_name("u8").is_err());
    let e = output_schema(&config("f32"), &signature, &input).unwrap_err();
    assert_eq!(e.located().0, Some("inputs.\"image_tensor:0\""), "{e}");
    assert!(e.to_string().contains("expected UInt8"), "{e}");
    let mut bad_batch = config("u8");
    bad_batch.batch.max_size = 0;
    let e = Model::new(bad_batch, 1).err().expect("max_size 0");
    assert_eq!(e.located().0, Some("batch.max_size"), "{e}");
}

/// Settings that cannot take effect as written are errors at their key, from validation
/// (`check`), from building the stage and from loading the model, never ignored or changed:
/// `drop_late` without a budget for lateness, and `poll_ms` under its minimum.
#[test]
fn settings_that_cannot_take_effect_are_errors_at_their_key() {
    use crate::{StageContext, StageKind};
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/ml100k_ncf_ctr.onnx");
    let config = |extra: serde_json::Value| -> ModelConfig {
        let mut json = serde_json::json!({
            "path": path,
            "inputs": { "user_id": "user", "item_id": "item" },
            "outputs": { "p_click": "p_click" },
            "executor": "dense",
        });
        if let (Some(json), serde_json::Value::Object(extra)) = (json.as_object_mut(), extra) {
            json.extend(extra);
        }
        serde_json::from_value(json).unwrap()
    };
    let ctx = StageContext {
        worker: 0,
        peers: 1,
        intra_op_threads: 1,
        gpus: &[],
    };
    let refused = [
        (
            serde_json::json!({ "batch": { "drop_late": true } }),
            "batch.drop_late",
            "needs batch.late_after_ms",
        ),
        (
            serde_json::json!({ "poll_ms": MIN_POLL_MS - 1 }),
            "poll_ms",
            "expected at least 10",
        ),
        (serde_json::json!({ "poll_ms": 0 }), "poll_ms", "found 0"),
    ];
    for (extra, key, says) in refused {
        let c = config(extra.clone());
        let errors = [
            c.check(&ctx).err(),
            c.build(&ctx).err(),
            Model::new(c.clone(), 1).err(),
        ];
        for e in errors {
            let e = e.unwrap_or_else(|| panic!("{extra} was accepted"));
            assert_eq!(e.located().0, Some(key), "{extra}: {e}");
            assert!(e.to_string().contains(says), "{extra}: {e}");
        }
    }
    // What can take effect is accepted: drop_late with a budget, the shortest poll_ms.
    for extra in [
        serde_json::json!({ "batch": { "drop_late": true, "late_after_ms": 0 } }),
        serde_json::json!({ "poll_ms": MIN_POLL_MS }),
    ] {
        let c = config(extra.clone());
        c.check(&ctx).unwrap_or_else(|e| panic!("{extra}: {e}"));
        Model::new(c, 1).unwrap_or_else(|e| panic!("{extra}: {e}"));
    }
}

/// The file's element types (validation) and ONNX Runtime's (running) map to the same Arrow
/// types.
#[test]
fn element_types_map_alike_from_the_file_and_from_onnx_runtime() {
    use ort::value::TensorElementType as T;
    let all = [
        T::Float32,
        T::Uint8,
        T::Int8,
        T::Uint16,
        T::Int16,
        T::Int32,
        T::Int64,
        T::String,
        T::Bool,
        T::Float16,
        T::Float64,
        T::Uint32,
        T::Uint64,
        T::Bfloat16,
        T::Complex64,
    ];
    for t in all {
        let code = ort::sys::ONNXTensorElementDataType::from(t) as i32;
        assert_eq!(
            signature::arrow_element(code),
            onnx::arrow_type(t),
            "{t} ({code})"
        );
    }
    assert_eq!(onnx::arrow_type(T::Float16), Some(DataType::Float16));
    assert_eq!(onnx::arrow_type(T::Bool), Some(DataType::Boolean));
    assert_eq!(onnx::arrow_type(T::String), None);
}

/// float16, bool and the 16/32/64-bit integers come out of ONNX Runtime values as tensor
/// columns of their Arrow type, keeping the per-row shape.
#[test]
fn float16_bool_and_int_outputs_become_tensor_columns() {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{ArrowPrimitiveType, Float16Type, Int16Type, UInt64Type};
    use ort::value::Tensor;
    type F16 = <Float16Type as ArrowPrimitiveType>::Native;
    use riffle_dataflow::tensor::{bool_tensor_values, tensor_field, tensor_values};
    onnx_runtime();
    let halves: Vec<F16> = [0.5f32, -2.0, 3.25, 1e-3].map(F16::from_f32).to_vec();
    let value = Tensor::from_array((vec![2i64, 2], halves.clone()))
        .unwrap()
        .into_dyn();
    let field = tensor_field("h", DataType::Float16, &[2]);
    let column = ort_io::output_column(&value, &field, 2).unwrap();
    assert_eq!(column.data_type(), field.data_type());
    assert_eq!(
        tensor_values::<Float16Type>(column.as_ref()).unwrap(),
        halves
    );
    // The rows the model returned must be the batch's.
    assert!(ort_io::output_column(&value, &field, 3).is_err());

    let bools = vec![true, false, false, true, true, false];
    let value = Tensor::from_array((vec![3i64], vec![true, false, true]))
        .unwrap()
        .into_dyn();
    let err = ort_io::output_column(&value, &tensor_field("b", DataType::Boolean, &[2]), 3);
    assert!(err.is_err(), "one value per row, not two");
    let value = Tensor::from_array((vec![3i64, 2], bools.clone()))
        .unwrap()
        .into_dyn();
    let column =
        ort_io::output_column(&value, &tensor_field("b", DataType::Boolean, &[2]), 3).unwrap();
    assert_eq!(bool_tensor_values(column.as_ref()).unwrap(), bools);

    let value = Tensor::from_array((vec![2i64], vec![-7i16, 300]))
        .unwrap()
        .into_dyn();
    let column =
        ort_io::output_column(&value, &tensor_field("i", DataType::Int16, &[]), 2).unwrap();
    assert_eq!(column.as_primitive::<Int16Type>().values(), &[-7, 300]);
    let value = Tensor::from_array((vec![1i64], vec![u64::MAX]))
        .unwrap()
        .into_dyn();
    let column =
        ort_io::output_column(&value, &tensor_field("u", DataType::UInt64, &[]), 1).unwrap();
    assert_eq!(column.as_primitive::<UInt64Type>().value(0), u64::MAX);
    // A column type that does not match the value's is an error, not a reinterpretation.
    let e = ort_io::output_column(&value, &tensor_field("u", DataType::Int64, &[]), 1);
    assert!(e.is_err());
}

/// The dense executor takes float32 and int64 only: other types are a clear error.
#[test]
fn the_dense_executor_refuses_other_element_types_by_name() {
    use arrow_array::types::{ArrowPrimitiveType, Float16Type};
    use arrow_array::{ArrayRef, Float16Array, RecordBatch};
    type F16 = <Float16Type as ArrowPrimitiveType>::Native;
    let batch = RecordBatch::try_from_iter(vec![(
        "x",
        std::sync::Arc::new(Float16Array::from(vec![F16::ONE])) as ArrayRef,
    )])
    .unwrap();
    let mapping = std::collections::BTreeMap::from([("x".to_string(), "x".to_string())]);
    let Err(e) = dense_io::dense_inputs(&batch, &mapping) else {
        panic!("float16 is not a dense executor input");
    };
    let text = e.to_string();
    assert!(
        text.contains("float32 or int64") && text.contains("Float16"),
        "{text}"
    );
}
