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
