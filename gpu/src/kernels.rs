//! The CUDA kernels, as `.cu` files under `gpu/kernels/` compiled by NVRTC at run time (and,
//! in tests, by g++ for the emulator).

use crate::device::Kernels;

/// The dense executor's kernels (`kernels/dense.cu`).
pub const DENSE: Kernels = Kernels {
    stage: "dense",
    source: include_str!("../kernels/dense.cu"),
    names: &[
        "gather_f32",
        "binary_f32",
        "unary_f32",
        "reduce_inner_f32",
        "copy_block_f32",
    ],
};

/// The resize stage's kernels (`kernels/resize.cu`).
pub const RESIZE: Kernels = Kernels {
    stage: "resize",
    source: include_str!("../kernels/resize.cu"),
    names: &[
        "resize_vertical",
        "resize_horizontal_f32",
        "resize_horizontal_u8",
    ],
};

#[cfg(test)]
mod tests {
    use super::*;

    /// Where NVRTC is installed (a GPU host, or the `nvidia-cuda-nvrtc` wheel on the library
    /// path), every kernel compiles and every name is an entry point; elsewhere compiling is
    /// refused with an error naming NVRTC. scripts/test.sh sets `RIFFLE_EXPECT_NVRTC=1`, so
    /// there the first case must hold.
    #[test]
    fn kernels_compile_where_nvrtc_is_present() {
        crate::expect_nvrtc_where_asked();
        // SAFETY: only tries to dlopen the NVRTC library by its usual names.
        let nvrtc = unsafe { cudarc::nvrtc::sys::is_culib_present() };
        for kernels in [DENSE, RESIZE] {
            if nvrtc {
                let ptx = cudarc::nvrtc::compile_ptx(kernels.source).unwrap().to_src();
                for name in kernels.names {
                    assert!(ptx.contains(&format!(".entry {name}(")), "{name} missing");
                }
            } else {
                let e = kernels.compile(0).err().expect("compiled without NVRTC");
                assert!(e.to_string().contains("NVRTC"), "{e}");
            }
        }
    }
}
