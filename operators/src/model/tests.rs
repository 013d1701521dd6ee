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

/// The signature read from the protobuf is what ONNX Runtime reports, on every bundled model.
#[test]
fn signatures_read_from_the_file_agree_with_onnx_runtime() {
    let models = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models");
    let Ok(env) = onnx::environment() else {
        eprintln!("ONNX Runtime is not installed: only reading the signatures");
        for name in ["ml100k_ncf_ctr.onnx", "ssdlite_person.onnx"] {
            Signature::read(&models.join(name)).unwrap();
        }
        return;
    };
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
