//! `riffle gpu-check`: prints what `riffle_operators::inference::gpu_check::run` measures on a GPU host —
//! every GPU path against its CPU counterpart on the same inputs, with the largest difference
//! and the throughput of each. Exits non-zero when a GPU result differs by more than the
//! stated bound or no GPU can be used.

use std::path::Path;

use anyhow::{bail, Result};
use riffle_operators::inference::gpu_check::GpuCheckReport;

pub fn gpu_check_command(model: &Path, frames: &Path, pairs: usize, ordinal: usize) -> Result<()> {
    let report = riffle_operators::inference::gpu_check::run(model, frames, pairs, ordinal)?;
    print_report(&report, frames);
    if !report.failed.is_empty() {
        bail!(
            "GPU results differ from the CPU ones: {}",
            report.failed.join("; ")
        );
    }
    println!("gpu-check: every GPU path agrees with its CPU path");
    Ok(())
}

fn print_report(report: &GpuCheckReport, frames: &Path) {
    if let Some(library) = &report.ort_cuda_missing {
        println!(
            "(ONNX Runtime's CUDA provider is not installed next to {}: its row is skipped)",
            library.display()
        );
    }
    let pairs = report.pairs;
    println!("\nCTR model, {pairs} (user, item) pairs per batch, model stage, host I/O included");
    println!("| engine | pairs/s | max |difference| to ONNX Runtime CPU |");
    println!("|---|---:|---:|");
    for row in &report.model {
        println!(
            "| {} | {:.0} | {:.2e} |",
            row.engine,
            pairs as f64 / row.per_batch.as_secs_f64(),
            row.max_diff
        );
    }
    println!("\nresize, {} frames of {}", report.frames, frames.display());
    println!("| configuration | GPU images/s | CPU images/s | max |GPU − reference| | max |GPU − CPU stage| |");
    println!("|---|---:|---:|---:|---:|");
    for row in &report.resize {
        let check = &row.check;
        println!(
            "| {} | {:.0} | {:.0} | {:.2e} | {:.2e} |",
            row.configuration,
            check.gpu_images_per_s,
            check.cpu_images_per_s,
            check.max_diff_vs_reference,
            check.max_diff_vs_cpu_stage
        );
    }
}
