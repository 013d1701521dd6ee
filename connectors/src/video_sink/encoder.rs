//! One file of one camera: RGB8 frames converted to YUV 4:2:0 (libswscale), encoded by libx264
//! (libavcodec) and muxed into a fragmented MP4 (libavformat), times in milliseconds; and the
//! camera's live stream, HLS of fragmented-MP4 segments fed the same packets.

use std::path::{Path, PathBuf};

use ffmpeg::format::Pixel;
use ffmpeg::software::scaling;
use ffmpeg::util::frame::video::Video;
use ffmpeg::{codec, encoder, format, Dictionary, Packet, Rational};
use ffmpeg_next as ffmpeg;

/// The encoder's and muxer's input clock: milliseconds.
const MS: Rational = Rational(1, 1000);
/// Each keyframe starts a fragment, so a file being written is playable up to its last
/// keyframe: at most this much of it is held back.
const KEYFRAME_SECONDS: f64 = 2.0;
/// A fragmented MP4 whose moov comes first and empty, then self-contained fragments: readable
/// while written, and after a crash up to the last whole fragment.
const MOVFLAGS: &str = "frag_keyframe+empty_moov+default_base_moof";

/// Why a file could not be written.
#[derive(Debug, thiserror::Error)]
pub(super) enum EncodeError {
    #[error("FFmpeg has no libx264 encoder (install an FFmpeg built with --enable-libx264)")]
    NoX264,
    #[error("{path}: a path FFmpeg cannot take (not UTF-8, or holding a NUL)")]
    Path { path: PathBuf },
    #[error("creating {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{doing} {path}: {source}")]
    Ffmpeg {
        doing: &'static str,
        path: PathBuf,
        #[source]
        source: ffmpeg::Error,
    },
}

/// How files are encoded.
#[derive(Clone, Debug)]
pub(super) struct Settings {
    pub fps: f64,
    pub crf: u32,
    pub preset: String,
}

/// An open file: frames of one size, timed from its first.
pub(super) struct Segment {
    path: PathBuf,
    // Declared before `output`: the encoder is freed before the file is closed.
    encoder: encoder::Video,
    scaler: scaling::Context,
    output: format::context::Output,
    stream_time_base: Rational,
    /// The source's size; the encoded one is rounded up to even numbers.
    width: u32,
    height: u32,
    /// Stream time (ms) of the first frame.
    start_ms: i64,
    /// The last frame's time in the file (ms from `start_ms`).
    last_pts: Option<i64>,
    frame_ms: i64,
    frames: u64,
}

/// Failures are ours to report (dead letters, sink errors), not FFmpeg's log lines: the same
/// level as the video source sets.
fn quiet() {
    static QUIET: std::sync::Once = std::sync::Once::new();
    QUIET.call_once(|| ffmpeg::util::log::set_level(ffmpeg::util::log::Level::Fatal));
}

// SAFETY: a `Segment` owns its FFmpeg contexts (scaler, encoder, muxer) alone, and FFmpeg lets
// any one thread at a time use a context; `&Segment` gives no access to them (`Sync` is not
// implemented), so moving it to the sink's thread is sound.
unsafe impl Send for Segment {}

/// H.264 in 4:2:0 needs even sides: an odd one gains a row or column, a copy of its last.
pub(super) fn even(side: u32) -> u32 {
    side.saturating_add(side % 2)
}

/// The error of FFmpeg failing at `doing` with `path`.
fn failed(doing: &'static str, path: &Path) -> impl FnOnce(ffmpeg::Error) -> EncodeError {
    let path = path.to_path_buf();
    move |source| EncodeError::Ffmpeg {
        doing,
        path,
        source,
    }
}

/// The H.264 encoder of a file's `size` (even sides) frames, opened with `settings`.
fn open_encoder(
    codec: ffmpeg::Codec,
    (width, height): (u32, u32),
    settings: &Settings,
    global_header: bool,
    path: &Path,
) -> Result<encoder::Video, EncodeError> {
    let mut context = codec::context::Context::new_with_codec(codec)
        .encoder()
        .video()
        .map_err(failed("configuring the encoder of", path))?;
    context.set_width(width);
    context.set_height(height);
    context.set_format(Pixel::YUV420P);
    context.set_time_base(MS);
    context.set_frame_rate(Some(Rational::from(settings.fps)));
    context.set_gop((settings.fps * KEYFRAME_SECONDS).round().clamp(1.0, 1e6) as u32);
    // No B-frames: decode order is presentation order, so the live stream's times run on
    // from one file's encoder to the next's.
    context.set_max_b_frames(0);
    if global_header {
        context.set_flags(codec::Flags::GLOBAL_HEADER);
    }
    let mut options = Dictionary::new();
    options.set("preset", &settings.preset);
    options.set("crf", &settings.crf.to_string());
    context
        .open_as_with(codec, options)
        .map_err(failed("opening the encoder of", path))
}

/// Adds the encoder's stream to `output` and writes the file's header; returns the time base
/// the muxer chose for the stream.
fn write_header(
    output: &mut format::context::Output,
    codec: ffmpeg::Codec,
    encoder: &encoder::Video,
    path: &Path,
) -> Result<Rational, EncodeError> {
    let mut stream = output
        .add_stream(codec)
        .map_err(failed("adding a stream to", path))?;
    stream.set_parameters(encoder);
    stream.set_time_base(MS);
    let mut options = Dictionary::new();
    options.set("movflags", MOVFLAGS);
    output
        .write_header_with(options)
        .map_err(failed("writing the header of", path))?;
    Ok(output.stream(0).map_or(MS, |s| s.time_base()))
}

impl Segment {
    /// Creates `path` for `width` × `height` frames, the first at stream time `start_ms`.
    pub fn create(
        path: &Path,
        width: u32,
        height: u32,
        start_ms: i64,
        settings: &Settings,
    ) -> Result<Self, EncodeError> {
        let name =
            path.to_str()
                .filter(|p| !p.contains('\0'))
                .ok_or_else(|| EncodeError::Path {
                    path: path.to_path_buf(),
                })?;
        quiet();
        let codec = encoder::find_by_name("libx264").ok_or(EncodeError::NoX264)?;
        let (ew, eh) = (even(width), even(height));
        let mut output = format::output_as(name, "mp4").map_err(failed("creating", path))?;
        let global_header = output
            .format()
            .flags()
            .contains(format::Flags::GLOBAL_HEADER);
        let encoder = open_encoder(codec, (ew, eh), settings, global_header, path)?;
        let stream_time_base = write_header(&mut output, codec, &encoder, path)?;
        let scaler = scaling::Context::get(
            Pixel::RGB24,
            ew,
            eh,
            Pixel::YUV420P,
            ew,
            eh,
            scaling::Flags::BILINEAR,
        )
        .map_err(failed("converting frames for", path))?;
        Ok(Segment {
            path: path.to_path_buf(),
            encoder,
            scaler,
            output,
            stream_time_base,
            width,
            height,
            start_ms,
            last_pts: None,
            frame_ms: (1000.0 / settings.fps).round().max(1.0) as i64,
            frames: 0,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Whether a `width` × `height` frame at stream time `t_ms` belongs in this file: the same
    /// size, not before its start (a camera started over) and within `segment_ms` of it.
    pub fn takes(&self, width: u32, height: u32, t_ms: i64, segment_ms: i64) -> bool {
        (width, height) == (self.width, self.height)
            && t_ms >= self.start_ms
            && t_ms - self.start_ms < segment_ms
    }

    /// Encodes one frame (`pixels`: packed RGB8 of this file's size) at stream time `t_ms`;
    /// its packets also go to `live`.
    pub fn push(
        &mut self,
        pixels: &[u8],
        t_ms: i64,
        live: &mut Option<Live>,
    ) -> Result<(), EncodeError> {
        let (ew, eh) = (even(self.width), even(self.height));
        let mut rgb = Video::new(Pixel::RGB24, ew, eh);
        let row = self.width as usize * 3;
        let stride = rgb.stride(0);
        let data = rgb.data_mut(0);
        for y in 0..eh as usize {
            // The padding row repeats the last.
            let from = y.min(self.height.saturating_sub(1) as usize) * row;
            let (Some(src), Some(dst)) = (
                pixels.get(from..from + row),
                data.get_mut(y * stride..y * stride + ew as usize * 3),
            ) else {
                return Err(self.error("filling a frame of", ffmpeg::Error::InvalidData));
            };
            let (body, pad) = dst.split_at_mut(row);
            body.copy_from_slice(src);
            if let (Some(last), false) = (src.get(row - 3..), pad.is_empty()) {
                pad.copy_from_slice(last);
            }
        }
        // A frame of its own each time: the encoder may still hold the last one.
        let mut yuv = Video::empty();
        self.scaler
            .run(&rgb, &mut yuv)
            .map_err(|e| self.error("converting a frame of", e))?;
        // Times must rise: a repeated or earlier one follows the last by 1 ms.
        let pts = match self.last_pts {
            Some(last) if t_ms - self.start_ms <= last => last + 1,
            _ => t_ms - self.start_ms,
        };
        self.last_pts = Some(pts);
        yuv.set_pts(Some(pts));
        self.encoder
            .send_frame(&yuv)
            .map_err(|e| self.error("encoding a frame of", e))?;
        self.frames += 1;
        self.drain(live)
    }

    /// Writes what the encoder has ready.
    fn drain(&mut self, live: &mut Option<Live>) -> Result<(), EncodeError> {
        let mut packet = Packet::empty();
        loop {
            match self.encoder.receive_packet(&mut packet) {
                Ok(()) => {}
                Err(ffmpeg::Error::Eof) => return Ok(()),
                Err(ffmpeg::Error::Other { errno }) if errno == libc::EAGAIN => return Ok(()),
                Err(e) => return Err(self.error("encoding", e)),
            }
            packet.set_stream(0);
            // The last frame of a fragment lasts this long (frames before it, until the next).
            packet.set_duration(self.frame_ms);
            if let Some(stream) = live.as_mut() {
                if let Err(e) = stream.write(&packet, self.start_ms) {
                    // The files matter more: they go on without it until the next one.
                    tracing::warn!("video sink: the live stream stopped: {e}");
                    *live = None;
                }
            }
            packet.rescale_ts(MS, self.stream_time_base);
            packet
                .write_interleaved(&mut self.output)
                .map_err(|e| self.error("writing", e))?;
        }
    }

    /// Hands what the muxer wrote to the file (whole fragments; the open one stays in memory).
    pub fn flush(&mut self) {
        // SAFETY: the context is open for writing (`format::output_as`), so `pb` is its open
        // I/O context until the context is dropped.
        unsafe {
            let pb = (*self.output.as_mut_ptr()).pb;
            if !pb.is_null() {
                ffmpeg::ffi::avio_flush(pb);
            }
        }
    }

    /// Encodes the frames the encoder holds (their packets also to `live`) and closes the file.
    pub fn finish(mut self, live: &mut Option<Live>) -> Result<(), EncodeError> {
        self.encoder
            .send_eof()
            .map_err(|e| self.error("finishing", e))?;
        self.drain(live)?;
        // Not `Output::write_trailer`, which takes any non-zero answer for an error: with
        // fragments `av_write_trailer` answers the bytes of the last one.
        // SAFETY: the context is open for writing and its header was written (`create`).
        let written = unsafe { ffmpeg::ffi::av_write_trailer(self.output.as_mut_ptr()) };
        if written < 0 {
            return Err(self.error("finishing", ffmpeg::Error::from(written)));
        }
        Ok(())
    }

    fn error(&self, doing: &'static str, source: ffmpeg::Error) -> EncodeError {
        EncodeError::Ffmpeg {
            doing,
            path: self.path.clone(),
            source,
        }
    }

    /// The encoder's parameter sets (SPS/PPS): a live stream started with one file's plays
    /// another's packets only when they are the same.
    fn extradata(&self) -> &[u8] {
        // SAFETY: the encoder is open; `extradata` is its own buffer of `extradata_size`
        // bytes (or null), unchanged until it is freed with the encoder, which `&self` outlives.
        unsafe {
            let context = self.encoder.as_ptr();
            let (data, size) = ((*context).extradata, (*context).extradata_size);
            if data.is_null() || size <= 0 {
                &[]
            } else {
                std::slice::from_raw_parts(data, size as usize)
            }
        }
    }
}

/// Segments kept in the live playlist: some 12 s at 2 s a segment.
const LIVE_SEGMENTS: u32 = 6;

/// A camera's live stream: `<dir>/index.m3u8`, `init.mp4` and `seg-NNNNN.m4s` (HLS with
/// fragmented-MP4 segments, a new one at each keyframe past 2 s, the oldest deleted), fed the
/// packets of the camera's files one after another, timed from its first frame.
pub(super) struct Live {
    dir: PathBuf,
    output: format::context::Output,
    time_base: Rational,
    /// Stream time (ms) that its time 0 is.
    origin_ms: i64,
    /// The last packet's time (ms from `origin_ms`).
    last_ms: Option<i64>,
    size: (u32, u32),
    extradata: Vec<u8>,
}

// SAFETY: as for `Segment`: the muxer is owned alone and used by one thread at a time.
unsafe impl Send for Live {}

impl Live {
    /// Starts a live stream in `dir` (emptied first) for `first`'s packets and those of later
    /// files of the same size and encoder settings.
    pub fn create(dir: &Path, first: &Segment) -> Result<Self, EncodeError> {
        let fail = |doing| {
            let path = dir.to_path_buf();
            move |source| EncodeError::Ffmpeg {
                doing,
                path,
                source,
            }
        };
        // What an earlier run left would mix into the new playlist's numbering.
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).map_err(|source| EncodeError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let playlist = dir.join("index.m3u8");
        let segments = dir.join("seg-%05d.m4s");
        let (Some(name), Some(segments)) = (playlist.to_str(), segments.to_str()) else {
            return Err(EncodeError::Path { path: playlist });
        };
        let mut output = format::output_as(name, "hls").map_err(fail("creating"))?;
        let codec = encoder::find_by_name("libx264").ok_or(EncodeError::NoX264)?;
        let mut stream = output
            .add_stream(codec)
            .map_err(fail("adding a stream to"))?;
        stream.set_parameters(&first.encoder);
        stream.set_time_base(MS);
        let mut options = Dictionary::new();
        options.set("hls_segment_type", "fmp4");
        options.set("hls_fmp4_init_filename", "init.mp4");
        options.set("hls_segment_filename", segments);
        options.set("hls_time", &KEYFRAME_SECONDS.to_string());
        options.set("hls_list_size", &LIVE_SEGMENTS.to_string());
        // temp_file: a reader never sees half a playlist or segment.
        options.set(
            "hls_flags",
            "delete_segments+independent_segments+temp_file",
        );
        output
            .write_header_with(options)
            .map_err(fail("writing the header of"))?;
        let time_base = output.stream(0).map_or(MS, |s| s.time_base());
        Ok(Live {
            dir: dir.to_path_buf(),
            output,
            time_base,
            origin_ms: first.start_ms,
            last_ms: None,
            size: (first.width, first.height),
            extradata: first.extradata().to_vec(),
        })
    }

    /// Whether `segment`'s packets can follow: the same picture size and parameter sets, and
    /// a start after the last packet (a camera that started over starts a new stream).
    pub fn continues_with(&self, segment: &Segment) -> bool {
        self.size == (segment.width, segment.height)
            && self.extradata == segment.extradata()
            && self
                .last_ms
                .is_none_or(|last| segment.start_ms - self.origin_ms > last)
    }

    /// Writes a copy of `packet` (times in ms from `start_ms`, the file's first frame).
    fn write(&mut self, packet: &Packet, start_ms: i64) -> Result<(), EncodeError> {
        let shift = start_ms - self.origin_ms;
        let mut copy = packet.clone();
        copy.set_pts(packet.pts().map(|t| t + shift));
        copy.set_dts(packet.dts().map(|t| t + shift));
        if let Some(t) = copy.dts() {
            self.last_ms = Some(self.last_ms.map_or(t, |last| last.max(t)));
        }
        copy.rescale_ts(MS, self.time_base);
        copy.write_interleaved(&mut self.output)
            .map_err(|source| EncodeError::Ffmpeg {
                doing: "writing",
                path: self.dir.join("index.m3u8"),
                source,
            })
    }

    /// Closes the playlist (it says the stream ended).
    pub fn finish(mut self) -> Result<(), EncodeError> {
        self.output
            .write_trailer()
            .map_err(|source| EncodeError::Ffmpeg {
                doing: "finishing",
                path: self.dir.join("index.m3u8"),
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            fps: 25.0,
            crf: 23,
            preset: "ultrafast".into(),
        }
    }

    #[test]
    fn odd_sizes_are_padded_to_even_and_every_frame_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("odd.mp4");
        let (w, h) = (33u32, 17u32);
        let mut s = Segment::create(&path, w, h, 1000, &settings()).unwrap();
        for i in 0..30u8 {
            let pixels = vec![i.wrapping_mul(8); (w * h * 3) as usize];
            s.push(&pixels, 1000 + i64::from(i) * 40, &mut None)
                .unwrap();
        }
        // The same time again is nudged, not refused.
        s.push(&vec![0; (w * h * 3) as usize], 1000 + 29 * 40, &mut None)
            .unwrap();
        assert!(s.takes(w, h, 1000 + 31 * 40, 10_000));
        assert!(
            !s.takes(w, h, 999, 10_000),
            "before the start: a camera started over"
        );
        assert!(!s.takes(w + 1, h, 1100, 10_000), "another size");
        assert!(!s.takes(w, h, 11_000, 10_000), "past the segment");
        assert_eq!(s.frames(), 31);
        s.finish(&mut None).unwrap();
        let probe = std::process::Command::new("ffprobe")
            .args(["-v", "error", "-count_frames", "-select_streams", "v:0"])
            .args([
                "-show_entries",
                "stream=nb_read_frames,width,height,codec_name",
            ])
            .args(["-of", "csv=p=0"])
            .arg(&path)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&probe.stdout);
        assert_eq!(out.trim(), "h264,34,18,31", "{out}");
        assert_eq!((even(33), even(18), even(1)), (34, 18, 2));
    }
}
