//! The emulator's own promises, on toy kernels.

use cudarc::driver::LaunchConfig;

use super::*;

/// Toy kernels exercising what the emulator promises.
const TOYS: &str = r#"
extern "C" __global__ void ids(unsigned int* out, int width) {
int x = blockIdx.x * blockDim.x + threadIdx.x;
int y = blockIdx.y * blockDim.y + threadIdx.y;
int z = blockIdx.z * blockDim.z + threadIdx.z;
int n = gridDim.x * blockDim.x;
int m = gridDim.y * blockDim.y;
out[(z * m + y) * n + x] = (unsigned)(x + 1000 * y + 1000000 * z) + 0 * width;
}
extern "C" __global__ void overrun(float* out, int n) {
int t = blockIdx.x * blockDim.x + threadIdx.x;
if (t > n) return;
out[t] = 1.0f;
}
extern "C" __global__ void racy(int* out) {
out[0] = (int)threadIdx.x;
}
extern "C" __global__ void wide(const long long* in, long long* out, long long k) {
out[threadIdx.x] = in[threadIdx.x] * k;
}
"#;

fn toys() -> Arc<Emulator> {
    Emulator::shared(TOYS, &["ids", "overrun", "racy", "wide"])
}

fn cfg(grid: (u32, u32, u32), block: (u32, u32, u32)) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: block,
        shared_mem_bytes: 0,
    }
}

#[test]
fn every_thread_of_every_block_runs_once_with_its_indices() {
    let emu = toys();
    let mut dev = Memory::new(&emu);
    let (grid, block) = ((3, 2, 2), (4, 3, 2));
    let (n, m, l) = (12usize, 6usize, 4usize);
    let out = dev.alloc_filled(n * m * l, u32::MAX);
    dev.launch_builder("ids")
        .arg(out)
        .arg(&0i32)
        .launch(cfg(grid, block));
    dev.synchronize().unwrap();
    let got = dev.dtoh::<u32>(out);
    for z in 0..l {
        for y in 0..m {
            for x in 0..n {
                let want = (x + 1000 * y + 1_000_000 * z) as u32;
                assert_eq!(got[(z * m + y) * n + x], want, "({x}, {y}, {z})");
            }
        }
    }
    // 64-bit scalars and buffers pass through whole.
    let input = dev.htod(&[1i64 << 40, -3, 7]);
    let wide = dev.alloc_filled(3, 0i64);
    dev.launch_builder("wide")
        .arg(input)
        .arg(wide)
        .arg(&(1i64 << 20))
        .launch(cfg((1, 1, 1), (3, 1, 1)));
    dev.synchronize().unwrap();
    assert_eq!(dev.dtoh::<i64>(wide), [1 << 60, -3 << 20, 7 << 20]);
}

#[test]
fn bad_launches_are_errors() {
    let emu = toys();
    let mut dev = Memory::new(&emu);
    let out = dev.alloc_filled(10, 0f32);
    let ints = dev.alloc_filled(10, 0i32);
    // Out of bounds by one (`t > n` instead of `t >= n`): AddressSanitizer or the guards.
    dev.launch_builder("overrun")
        .arg(out)
        .arg(&10i32)
        .launch(LaunchConfig::for_num_elems(11));
    let e = dev.synchronize().unwrap_err();
    assert!(
        e.contains("heap-buffer-overflow") || e.contains("wrote outside buffer"),
        "{e}"
    );
    let mut fails = |push: &dyn Fn(&mut Memory), expected: &str| {
        push(&mut dev);
        let e = dev.synchronize().expect_err(expected);
        assert!(e.contains(expected), "expected `{expected}` in: {e}");
    };
    // Every thread writing one element.
    fails(
        &|d| {
            d.launch_builder("racy")
                .arg(ints)
                .launch(cfg((1, 1, 1), (8, 1, 1)))
        },
        "forwards and backwards",
    );
    // A scalar of the wrong width, a buffer of the wrong type, a missing argument.
    fails(
        &|d| {
            d.launch_builder("overrun")
                .arg(out)
                .arg(&10i64)
                .launch(cfg((1, 1, 1), (1, 1, 1)))
        },
        "parameter 1 is int (i32) (4 bytes), but long long (i64) (8 bytes) was pushed",
    );
    fails(
        &|d| {
            d.launch_builder("overrun")
                .arg(ints)
                .arg(&10i32)
                .launch(cfg((1, 1, 1), (1, 1, 1)))
        },
        "points to float (f32), but the buffer holds int (i32)",
    );
    fails(
        &|d| {
            d.launch_builder("overrun")
                .arg(out)
                .launch(cfg((1, 1, 1), (1, 1, 1)))
        },
        "takes 2 parameters, but 1 were pushed",
    );
    // CUDA's launch limits.
    for (grid, block, expected) in [
        ((0, 1, 1), (1, 1, 1), "an empty launch"),
        ((1, 1, 1), (0, 1, 1), "an empty launch"),
        ((1, 65_536, 1), (1, 1, 1), "the grid exceeds"),
        ((1, 1, 1), (1025, 1, 1), "the block exceeds"),
        ((1, 1, 1), (64, 32, 1), "the block exceeds"),
    ] {
        fails(
            &|d| {
                d.launch_builder("overrun")
                    .arg(out)
                    .arg(&0i32)
                    .launch(cfg(grid, block))
            },
            expected,
        );
    }
    // The device still works after failed launches.
    dev.launch_builder("overrun")
        .arg(out)
        .arg(&8i32)
        .launch(cfg((1, 1, 1), (9, 1, 1)));
    dev.synchronize().unwrap();
    assert_eq!(
        dev.dtoh::<f32>(out)[..],
        [1.0; 9].iter().chain(&[0.0]).copied().collect::<Vec<_>>()[..]
    );
}

#[test]
fn guard_bytes_catch_writes_out_of_bounds_without_sanitizers() {
    let emu = Emulator::build(TOYS, &["overrun"], false).unwrap();
    let mut dev = Memory::new(&emu);
    let out = dev.alloc_filled(10, 0f32);
    dev.launch_builder("overrun")
        .arg(out)
        .arg(&10i32)
        .launch(LaunchConfig::for_num_elems(11));
    let e = dev.synchronize().unwrap_err();
    assert!(
        e.contains("overrun wrote outside buffer 0 (10 elements)"),
        "{e}"
    );
}

#[test]
fn kernels_needing_threads_together_are_refused() {
    let src = "extern \"C\" __global__ void k(float* x) { __shared__ float s[32]; }";
    let e = Emulator::try_new(src, &["k"]).err().unwrap();
    assert!(e.contains("__shared__"), "{e}");
}
