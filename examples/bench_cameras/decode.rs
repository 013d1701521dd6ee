//! Decode throughput: the video source's decoder (ffmpeg-next, one decoding thread, frames
//! converted to RGB and built into Arrow batches) against the `ffmpeg` command decoding the
//! same file to raw RGB on one thread, side by side in each round.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::Context;
use riffle_connectors::video::{VideoConfig, VideoSource};
use riffle_dataflow::SourceFactory;

use super::{cpu_seconds, spread};

/// One decoder's frames, wall seconds and CPU seconds.
struct Decoded {
    frames: f64,
    wall: f64,
    cpu: f64,
}

/// Prints the decode table for `data/videos/live/bikes-0.mp4`.
pub fn decode_table(repo: &Path, rounds: usize, tick: f64) -> anyhow::Result<()> {
    let file = repo.join("data/videos/live/bikes-0.mp4");
    // The conversion flags the source's decoder uses (libswscale), for a like-for-like row.
    let same_flags = ["-sws_flags", "bilinear+accurate_rnd+full_chroma_int"];
    let mut rows: Vec<(&str, Vec<Decoded>)> = vec![
        (
            "riffle video source (ffmpeg-next, 1 decoding thread → RGB Arrow batches)",
            Vec::new(),
        ),
        (
            "`ffmpeg -threads 1 -i FILE -f rawvideo -pix_fmt rgb24 -y /dev/null`",
            Vec::new(),
        ),
        (
            "the same with `-sws_flags bilinear+accurate_rnd+full_chroma_int` (the source's conversion)",
            Vec::new(),
        ),
    ];
    for round in 0..rounds {
        rows[0].1.push(ours(&file, round, tick)?);
        rows[1].1.push(ffmpeg(&file, &[])?);
        rows[2].1.push(ffmpeg(&file, &same_flags)?);
    }
    let frames = rows[0].1.first().map_or(0.0, |d| d.frames);
    println!(
        "### Decode throughput: `data/videos/live/bikes-0.mp4` ({frames:.0} frames, 640×272 H.264) to RGB, {rounds} round(s); median (min–max)\n"
    );
    println!("| decoder | frames | frames/s (wall) | frames per CPU-second (per core) | per core vs `ffmpeg` (same round) |");
    println!("|---|---:|---:|---:|---:|");
    let base: Vec<f64> = rows[1].1.iter().map(|d| d.frames / d.cpu).collect();
    for (name, runs) in &rows {
        println!(
            "| {name} | {} | {} | {} | {} |",
            spread(runs.iter().map(|d| d.frames), 0),
            spread(runs.iter().map(|d| d.frames / d.wall), 0),
            spread(runs.iter().map(|d| d.frames / d.cpu), 0),
            spread(
                runs.iter().zip(&base).map(|(d, b)| (d.frames / d.cpu) / b),
                2
            ),
        );
    }
    println!();
    Ok(())
}

/// Every frame through the video source (not paced, nothing dropped), read on this thread.
fn ours(file: &Path, round: usize, tick: f64) -> anyhow::Result<Decoded> {
    let config: VideoConfig = serde_saphyr::from_str(&format!(
        "{{ cameras: [{{ id: \"decode-{round}\", uri: \"{}\" }}], batch_size: 64, queue_size: 64 }}",
        file.display()
    ))?;
    let source = VideoSource::new(&config)?;
    let (cpu0, t0) = (cpu_seconds(tick)?, Instant::now());
    let mut part = source.partition(0, 1)?;
    let mut frames = 0usize;
    while let Some(batch) = part.next_batch()? {
        anyhow::ensure!(batch.rejected.is_empty(), "{:?}", batch.rejected);
        frames += batch.records.num_rows();
    }
    Ok(Decoded {
        frames: frames as f64,
        wall: t0.elapsed().as_secs_f64(),
        cpu: cpu_seconds(tick)? - cpu0,
    })
}

/// The `ffmpeg` command on one thread; its frames and CPU time from its own report
/// (`-benchmark`: `bench: utime=…s stime=…s rtime=…s`).
fn ffmpeg(file: &Path, extra: &[&str]) -> anyhow::Result<Decoded> {
    let t0 = Instant::now();
    let out = Command::new("ffmpeg")
        .args([
            "-hide_banner",
            "-nostdin",
            "-benchmark",
            "-threads",
            "1",
            "-i",
        ])
        .arg(file)
        .args(extra)
        .args(["-f", "rawvideo", "-pix_fmt", "rgb24", "-y", "/dev/null"])
        .output()
        .context("running ffmpeg")?;
    let wall = t0.elapsed().as_secs_f64();
    let log = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(out.status.success(), "ffmpeg failed: {log}");
    // Progress lines end in \r; the last `frame=` is the total.
    let frames: f64 = log
        .rsplit("frame=")
        .next()
        .and_then(|s| s.split_whitespace().next())
        .context("ffmpeg printed no frame count")?
        .parse()?;
    let field = |key: &str| -> anyhow::Result<f64> {
        let at = log.rfind(key).context(format!("ffmpeg printed no {key}"))?;
        let value = log[at + key.len()..]
            .split(|c: char| c == 's' || c.is_whitespace())
            .next()
            .context(key.to_string())?;
        Ok(value.parse()?)
    };
    let cpu = field("utime=")? + field("stime=")?;
    Ok(Decoded { frames, wall, cpu })
}
