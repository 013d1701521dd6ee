//! Decode throughput: the video source's decoder (ffmpeg-next, one decoding thread, frames
//! converted to RGB and built into Arrow batches) against the `ffmpeg` command decoding the
//! same file to raw RGB on one thread, side by side in each round. Each decoder's frames are
//! hashed once, untimed: a ratio is printed only against a decoder whose RGB frames are the same
//! bytes (the `ffmpeg` run with the source's conversion flags), "outputs differ" otherwise.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::Context;
use arrow_array::cast::AsArray;
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
    // The outputs, untimed: sha1 of every RGB frame in order.
    let outputs = [
        ours_digest(&file)?,
        ffmpeg_digest(&file, &[])?,
        ffmpeg_digest(&file, &same_flags)?,
    ];
    let frames = rows[0].1.first().map_or(0.0, |d| d.frames);
    println!(
        "### Decode throughput: `data/videos/live/bikes-0.mp4` ({frames:.0} frames, 640×272 H.264) to RGB, {rounds} round(s); median (min–max)\n"
    );
    println!("| decoder | frames | frames/s (wall) | frames per CPU-second (per core) | per core vs `ffmpeg` with the source's conversion (same round) | RGB frames (sha1) |");
    println!("|---|---:|---:|---:|---:|---|");
    // The like-for-like row is the base: the same conversion, so the same bytes.
    let base: Vec<f64> = rows[2].1.iter().map(|d| d.frames / d.cpu).collect();
    for ((name, runs), output) in rows.iter().zip(&outputs) {
        let ratio = if *output == outputs[2] {
            spread(
                runs.iter().zip(&base).map(|(d, b)| (d.frames / d.cpu) / b),
                2,
            )
        } else {
            "outputs differ".to_string()
        };
        println!(
            "| {name} | {} | {} | {} | {ratio} | {output} |",
            spread(runs.iter().map(|d| d.frames), 0),
            spread(runs.iter().map(|d| d.frames / d.wall), 0),
            spread(runs.iter().map(|d| d.frames / d.cpu), 0),
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

/// sha1 (12 hex digits) of the video source's RGB frames of `file`, in order.
fn ours_digest(file: &Path) -> anyhow::Result<String> {
    let config: VideoConfig = serde_saphyr::from_str(&format!(
        "{{ cameras: [{{ id: \"decode-digest\", uri: \"{}\" }}], batch_size: 64, queue_size: 64 }}",
        file.display()
    ))?;
    let source = VideoSource::new(&config)?;
    let mut part = source.partition(0, 1)?;
    let mut sha1 = sha1_smol::Sha1::new();
    while let Some(batch) = part.next_batch()? {
        let pixels = batch
            .records
            .column_by_name(riffle_connectors::video::PIXELS)
            .and_then(|c| c.as_binary_opt::<i32>())
            .context("the video source's batch has no binary `pixels` column")?;
        for frame in pixels.iter() {
            sha1.update(frame.context("a null frame")?);
        }
    }
    Ok(short(&sha1))
}

/// sha1 (12 hex digits) of what `ffmpeg` writes as raw RGB for `file` with `extra` flags.
fn ffmpeg_digest(file: &Path, extra: &[&str]) -> anyhow::Result<String> {
    let mut child = Command::new("ffmpeg")
        .args([
            "-hide_banner",
            "-nostdin",
            "-loglevel",
            "error",
            "-threads",
            "1",
            "-i",
        ])
        .arg(file)
        .args(extra)
        .args(["-f", "rawvideo", "-pix_fmt", "rgb24", "-"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running ffmpeg")?;
    let mut stdout = child.stdout.take().context("ffmpeg's stdout")?;
    let mut sha1 = sha1_smol::Sha1::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = stdout.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        sha1.update(buffer.get(..n).context("a read past the buffer")?);
    }
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "ffmpeg failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(short(&sha1))
}

fn short(sha1: &sha1_smol::Sha1) -> String {
    let hex = sha1.digest().to_string();
    format!("sha1={}", hex.get(..12).unwrap_or(&hex))
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

/// Decoding's ceiling for `file`: frames per CPU-second of `ffmpeg -threads 1` decoding it and
/// converting to 300×300 RGB in one pass with the source's swscale flags (median of 3).
pub fn ceiling(file: &Path) -> anyhow::Result<f64> {
    let flags = [
        "-s",
        "300x300",
        "-sws_flags",
        "bilinear+accurate_rnd+full_chroma_int",
    ];
    let mut rates = Vec::new();
    for _ in 0..3 {
        let d = ffmpeg(file, &flags)?;
        rates.push(d.frames / d.cpu.max(1e-9));
    }
    Ok(super::quantile(&mut rates, 0.5))
}
