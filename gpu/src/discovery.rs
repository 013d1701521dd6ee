//! Discovery through the CUDA driver (loaded at run time, so the same binary runs on
//! machines without CUDA) and the worker → GPU assignment.

use std::sync::OnceLock;

use cudarc::driver::CudaContext;

use crate::DeviceSpec;

/// One CUDA device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuInfo {
    pub ordinal: usize,
    pub name: String,
    pub total_bytes: usize,
    pub free_bytes: usize,
}

/// The process's GPUs, or why there are none usable (no driver library, no device, an error).
/// Probed once: the answer does not change while the process runs.
pub fn discover() -> Result<Vec<GpuInfo>, String> {
    static FOUND: OnceLock<Result<Vec<GpuInfo>, String>> = OnceLock::new();
    FOUND.get_or_init(probe).clone()
}

fn probe() -> Result<Vec<GpuInfo>, String> {
    // cudarc panics when it cannot load libcuda; ask first.
    // SAFETY: only tries to dlopen the driver library by its usual names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("the CUDA driver library (libcuda.so) is not installed".into());
    }
    let count = CudaContext::device_count().map_err(|e| format!("CUDA driver: {e}"))?;
    if count <= 0 {
        return Err("the CUDA driver reports no device".into());
    }
    (0..count as usize)
        .map(|ordinal| {
            let ctx = CudaContext::new(ordinal).map_err(|e| format!("cuda:{ordinal}: {e}"))?;
            let (free_bytes, total_bytes) = ctx
                .mem_get_info()
                .map_err(|e| format!("cuda:{ordinal}: {e}"))?;
            Ok(GpuInfo {
                ordinal,
                name: ctx.name().map_err(|e| format!("cuda:{ordinal}: {e}"))?,
                total_bytes,
                free_bytes,
            })
        })
        .collect()
}

/// The GPU worker `worker` uses: `map[worker mod map.len()]` when a map is given, else
/// `worker mod gpus`.
pub fn gpu_for_worker(worker: usize, gpus: usize, map: &[usize]) -> Option<usize> {
    if !map.is_empty() {
        return map.get(worker % map.len()).copied();
    }
    (gpus > 0).then(|| worker % gpus)
}

/// The GPU a stage with `device` uses on `worker`: none for `cpu` and for `auto` without a
/// usable GPU; `cuda:N` must name a GPU here. Errors start with "device `…`:" so validation
/// can point at the key.
pub fn resolve(device: &DeviceSpec, worker: usize, map: &[usize]) -> Result<Option<usize>, String> {
    // `cpu` loads no CUDA library.
    if *device == DeviceSpec::Cpu {
        return Ok(None);
    }
    match (device, discover()) {
        (DeviceSpec::Cpu, _) => Ok(None),
        (DeviceSpec::Cuda(n), Err(why)) => Err(format!(
            "device `cuda:{n}`: no CUDA device is usable here ({why}); use `cpu`, or `auto` to take a GPU when there is one"
        )),
        (DeviceSpec::Cuda(n), Ok(gpus)) if *n >= gpus.len() => Err(format!(
            "device `cuda:{n}`: this machine has {} GPU(s), cuda:0..cuda:{}",
            gpus.len(),
            gpus.len().saturating_sub(1)
        )),
        (DeviceSpec::Cuda(n), Ok(_)) => Ok(Some(*n)),
        (DeviceSpec::Auto, Err(why)) => {
            // Once per process, not once per worker and stage.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| tracing::info!("device `auto` runs on CPU: no CUDA device ({why})"));
            Ok(None)
        }
        (DeviceSpec::Auto, Ok(gpus)) => match gpu_for_worker(worker, gpus.len(), map) {
            Some(g) if g >= gpus.len() => Err(format!(
                "device `auto`: runtime.gpus maps worker {worker} to cuda:{g}, but this machine has {} GPU(s)",
                gpus.len()
            )),
            found => Ok(found),
        },
    }
}

/// For tests of CUDA kernels: with `RIFFLE_EXPECT_NVRTC=1` (scripts/test.sh sets it after
/// fetching NVRTC) a missing NVRTC fails the test instead of leaving the kernels uncompiled.
///
/// # Panics
/// When NVRTC was asked for and cannot be loaded: that is the point.
pub fn expect_nvrtc_where_asked() {
    if std::env::var("RIFFLE_EXPECT_NVRTC").is_ok_and(|v| v == "1") {
        // SAFETY: only tries to dlopen the NVRTC library by its usual names.
        assert!(
            unsafe { cudarc::nvrtc::sys::is_culib_present() },
            "RIFFLE_EXPECT_NVRTC=1 but NVRTC cannot be loaded: \
             export LD_LIBRARY_PATH=\"$(scripts/nvrtc.sh):$LD_LIBRARY_PATH\""
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_spread_over_gpus_or_follow_the_map() {
        assert_eq!(gpu_for_worker(0, 2, &[]), Some(0));
        assert_eq!(gpu_for_worker(3, 2, &[]), Some(1));
        assert_eq!(gpu_for_worker(2, 0, &[]), None);
        assert_eq!(gpu_for_worker(1, 4, &[3, 3, 0]), Some(3));
        assert_eq!(gpu_for_worker(5, 4, &[3, 3, 0]), Some(0));
    }

    #[test]
    fn devices_resolve_to_a_gpu_or_to_none_with_a_reason() {
        assert_eq!(resolve(&DeviceSpec::Cpu, 3, &[]), Ok(None));
        match discover() {
            Err(_) => {
                // No GPU: `auto` is CPU and `cuda:N` an error naming the key.
                assert_eq!(resolve(&DeviceSpec::Auto, 1, &[0]), Ok(None));
                let e = resolve(&DeviceSpec::Cuda(0), 0, &[]).unwrap_err();
                assert!(e.starts_with("device `cuda:0`: no CUDA device"), "{e}");
            }
            Ok(gpus) => {
                let n = gpus.len();
                assert_eq!(resolve(&DeviceSpec::Auto, n + 1, &[]), Ok(Some(1 % n)));
                assert_eq!(resolve(&DeviceSpec::Cuda(0), 5, &[]), Ok(Some(0)));
                assert!(resolve(&DeviceSpec::Cuda(n), 0, &[]).is_err());
                assert!(resolve(&DeviceSpec::Auto, 0, &[n]).is_err());
            }
        }
    }

    #[test]
    fn discovery_never_panics_and_explains_an_absence() {
        match discover() {
            Ok(gpus) => assert!(!gpus.is_empty()),
            Err(why) => assert!(!why.is_empty()),
        }
    }
}
