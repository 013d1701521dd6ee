//! One camera's stream through FFmpeg's libraries: demux (libavformat: files, RTSP, HTTP/HLS),
//! decode (libavcodec: H.264, H.265, …) and convert to RGB8 (libswscale).

use std::ffi::{c_int, c_void, CString};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::time::Instant;

use ffmpeg::format::Pixel;
use ffmpeg::software::scaling;
use ffmpeg::util::frame::video::Video;
use ffmpeg::{codec, format, media, Dictionary, Packet, Rational};
use ffmpeg_next as ffmpeg;

/// Why a camera's stream could not be opened or read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum VideoError {
    #[error("opening {uri}: {source}")]
    Open {
        uri: String,
        #[source]
        source: ffmpeg::Error,
    },
    #[error("{uri} has no video stream")]
    NoVideo { uri: String },
    #[error("{uri}: cannot decode its video: {source}")]
    Decoder {
        uri: String,
        #[source]
        source: ffmpeg::Error,
    },
    #[error("reading {uri}: {source}")]
    Read {
        uri: String,
        #[source]
        source: ffmpeg::Error,
    },
    /// `doing` (opening or reading) took longer than `timeout_ms`.
    #[error("{doing} {uri}: timed out after {timeout_ms} ms")]
    TimedOut {
        doing: &'static str,
        uri: String,
        timeout_ms: u64,
    },
}

/// How to open a stream.
#[derive(Clone, Debug)]
pub(crate) struct OpenOptions {
    pub live: bool,
    pub rtsp_tcp: bool,
    pub timeout_ms: u64,
    /// How much of a live stream FFmpeg reads to describe it before the first frame.
    pub probe_ms: u64,
    /// Frames converted straight to this size (one swscale pass) instead of their own.
    pub scale_to: Option<(u32, u32)>,
}

/// Something the stream produced.
pub(crate) enum Decoded<'a> {
    Frame {
        pts_ms: Option<i64>,
        image: Image<'a>,
    },
    /// A packet or frame that did not decode, and why; `frame` when it was a decoded frame
    /// (it takes a frame number), not a packet the decoder refused.
    Corrupt {
        pts_ms: Option<i64>,
        reason: String,
        frame: bool,
    },
}

/// Whether to go on reading.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    Continue,
    Stop,
}

/// How a stream's reading ended without an error.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    Eof,
    Stopped,
}

/// A decoded frame, converted to RGB8 only when asked (thinned-out frames never are).
pub(crate) struct Image<'a> {
    frame: &'a Video,
    scaler: &'a mut Option<scaling::Context>,
    scale_to: Option<(u32, u32)>,
}

/// The conversion's filter: bilinear taps, widened over every source pixel when shrinking
/// (swscale scales its filters with the ratio), with accurate rounding and full chroma.
pub(crate) fn scaling_flags() -> scaling::Flags {
    scaling::Flags::BILINEAR | scaling::Flags::ACCURATE_RND | scaling::Flags::FULL_CHR_H_INT
}

impl Image<'_> {
    /// `(width, height, pixels)`: the frame's own size, and its pixels in RGB8, interleaved,
    /// row-major, no padding, at the frame's size or the stream's `scale_to`: YUV to RGB and
    /// scaling in one swscale pass, from the decoder's planes.
    pub fn rgb(self) -> Result<(u32, u32, Vec<u8>), ffmpeg::Error> {
        let (format, width, height) =
            (self.frame.format(), self.frame.width(), self.frame.height());
        let (out_w, out_h) = self.scale_to.unwrap_or((width, height));
        let fits = self.scaler.as_ref().is_some_and(|s| {
            let (i, o) = (s.input(), s.output());
            (i.format, i.width, i.height, o.width, o.height)
                == (format, width, height, out_w, out_h)
        });
        if !fits {
            *self.scaler = Some(scaling::Context::get(
                format,
                width,
                height,
                Pixel::RGB24,
                out_w,
                out_h,
                scaling_flags(),
            )?);
        }
        let Some(scaler) = self.scaler.as_mut() else {
            return Err(ffmpeg::Error::Bug);
        };
        let mut out = Video::empty();
        scaler.run(self.frame, &mut out)?;
        let row = out_w as usize * 3;
        let stride = out.stride(0);
        let data = out.data(0);
        let mut pixels = Vec::with_capacity(row * out_h as usize);
        for y in 0..out_h as usize {
            let line = data
                .get(y * stride..y * stride + row)
                .ok_or(ffmpeg::Error::InvalidData)?;
            pixels.extend_from_slice(line);
        }
        Ok((width, height, pixels))
    }
}

/// An opened stream, ready to decode.
pub(crate) struct Stream {
    uri: String,
    input: format::context::Input,
    index: usize,
    time_base: Rational,
    start: Option<i64>,
    decoder: ffmpeg::decoder::Video,
    scaler: Option<scaling::Context>,
    scale_to: Option<(u32, u32)>,
    /// Whether each packet read has `timeout_ms` (live streams but HLS and DASH).
    timed_reads: bool,
    /// A live stream's interrupt callback state. Declared after `input`, so dropped after it:
    /// the context calls back into it until it is closed.
    watchdog: Option<Arc<Watchdog>>,
}

/// What a live stream's interrupt callback reads. FFmpeg abandons the blocking call it is in
/// (connecting, probing, reading a packet) within ~0.1 s of the callback saying so: an exact
/// deadline, and a stop that does not wait for the stream. FFmpeg's own socket timeouts take
/// up to twice as long: the read they end returns the packet its parser held back, and the
/// next read waits a whole timeout again.
struct Watchdog {
    stop: Arc<AtomicBool>,
    timeout_ms: u64,
    origin: Instant,
    /// Milliseconds after `origin` past which the current call is abandoned.
    deadline_ms: AtomicU64,
    /// Whether the deadline interrupted FFmpeg since the clock was last started.
    fired: AtomicBool,
}

impl Watchdog {
    fn new(stop: &Arc<AtomicBool>, timeout_ms: u64) -> Self {
        Watchdog {
            stop: Arc::clone(stop),
            timeout_ms,
            origin: Instant::now(),
            deadline_ms: AtomicU64::new(u64::MAX),
            fired: AtomicBool::new(false),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Starts the clock of the call about to be made.
    fn arm(&self) {
        let deadline = self.now_ms().saturating_add(self.timeout_ms);
        self.fired.store(false, Ordering::Relaxed);
        self.deadline_ms.store(deadline, Ordering::Relaxed);
    }

    /// Stops the clock: what runs between calls (the consumer) has no deadline.
    fn disarm(&self) {
        self.deadline_ms.store(u64::MAX, Ordering::Relaxed);
    }

    /// What the interrupt callback answers.
    fn interrupts(&self) -> bool {
        if self.stop.load(Ordering::Relaxed) {
            return true;
        }
        let expired = self.now_ms() >= self.deadline_ms.load(Ordering::Relaxed);
        if expired {
            self.fired.store(true, Ordering::Relaxed);
        }
        expired
    }

    /// The timeout, once the deadline interrupted the last call (`doing`: opening or reading).
    fn timed_out(&self, doing: &'static str, uri: &str) -> Option<VideoError> {
        self.fired
            .load(Ordering::Relaxed)
            .then(|| VideoError::TimedOut {
                doing,
                uri: uri.to_string(),
                timeout_ms: self.timeout_ms,
            })
    }
}

/// The live streams' `AVIOInterruptCB`: non-zero abandons the blocking call.
unsafe extern "C" fn interrupted(opaque: *mut c_void) -> c_int {
    // SAFETY: `opaque` is `Arc::as_ptr` of a `Watchdog` that `open_live` and then the `Stream`
    // keep alive until the context is closed; it is only used through shared references.
    let watchdog = unsafe { &*opaque.cast::<Watchdog>() };
    c_int::from(watchdog.interrupts())
}

/// What `format::input_with_dictionary` does, with `watchdog` as the context's interrupt
/// callback (ffmpeg-next's `input_with_interrupt` takes no options).
fn open_live(
    uri: &str,
    options: Dictionary,
    watchdog: &Arc<Watchdog>,
) -> Result<format::context::Input, ffmpeg::Error> {
    let url = CString::new(uri).map_err(|_| ffmpeg::Error::InvalidData)?;
    // SAFETY: a plain allocation, null when out of memory.
    let mut ctx = unsafe { ffmpeg::ffi::avformat_alloc_context() };
    if ctx.is_null() {
        return Err(ffmpeg::Error::Other {
            errno: ffmpeg::util::error::ENOMEM,
        });
    }
    let callback = ffmpeg::ffi::AVIOInterruptCB {
        callback: Some(interrupted),
        opaque: Arc::as_ptr(watchdog).cast_mut().cast(),
    };
    watchdog.arm();
    // SAFETY: `ctx` is the valid, unopened context just allocated, and `opaque` outlives it (see
    // `interrupted`). The options are handed over and their leftovers taken back and freed;
    // on failure `avformat_open_input` frees `ctx` itself.
    let opened = unsafe {
        (*ctx).interrupt_callback = callback;
        let mut opts = options.disown();
        let opened =
            ffmpeg::ffi::avformat_open_input(&mut ctx, url.as_ptr(), ptr::null(), &mut opts);
        drop(Dictionary::own(opts));
        opened
    };
    if opened < 0 {
        return Err(ffmpeg::Error::from(opened));
    }
    // SAFETY: `ctx` is open and owned by no one else: the `Input` closes it when dropped
    // (also when probing fails, below).
    let mut input = unsafe { format::context::Input::wrap(ctx) };
    watchdog.arm();
    // SAFETY: `input`'s context is open; no per-stream options.
    let probed =
        unsafe { ffmpeg::ffi::avformat_find_stream_info(input.as_mut_ptr(), ptr::null_mut()) };
    if probed < 0 {
        return Err(ffmpeg::Error::from(probed));
    }
    watchdog.disarm();
    Ok(input)
}

fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        // Failures are ours to report (dead letters, camera errors), not FFmpeg's log lines.
        ffmpeg::util::log::set_level(ffmpeg::util::log::Level::Fatal);
        ffmpeg::format::network::init();
    });
}

/// Opens `uri`; `stop` (the camera's stop flag) also abandons a live stream's opening and
/// reads.
pub(crate) fn open(
    uri: &str,
    options: &OpenOptions,
    stop: &Arc<AtomicBool>,
) -> Result<Stream, VideoError> {
    init();
    let mut dict = Dictionary::new();
    if options.live {
        let timeout_us = options.timeout_ms.saturating_mul(1000).to_string();
        if uri.starts_with("rtsp") {
            dict.set(
                "rtsp_transport",
                if options.rtsp_tcp { "tcp" } else { "udp" },
            );
            // The RTSP demuxer's socket timeout (µs; `stimeout` before FFmpeg 5).
            dict.set("timeout", &timeout_us);
        } else {
            dict.set("rw_timeout", &timeout_us);
        }
        // FFmpeg reads up to 5 s of a stream to describe it before the first frame; an H.264
        // or H.265 camera is described by its first key frame: ~1.4 s → ~0.7 s to the first
        // frame over RTSP here at 500 ms.
        dict.set(
            "analyzeduration",
            &options.probe_ms.saturating_mul(1000).to_string(),
        );
    }
    let open_error = |source| VideoError::Open {
        uri: uri.to_string(),
        source,
    };
    let (input, watchdog) = if options.live {
        let watchdog = Arc::new(Watchdog::new(stop, options.timeout_ms));
        let input = open_live(uri, dict, &watchdog).map_err(|e| {
            watchdog
                .timed_out("opening", uri)
                .unwrap_or_else(|| open_error(e))
        })?;
        (input, Some(watchdog))
    } else {
        (
            format::input_with_dictionary(&uri, dict).map_err(open_error)?,
            None,
        )
    };
    // An HLS or DASH read may rightly wait a whole segment for the playlist to grow: those
    // keep FFmpeg's per-request `rw_timeout` only.
    let timed_reads = watchdog.is_some() && !matches!(input.format().name(), "hls" | "dash");
    let stream = input
        .streams()
        .best(media::Type::Video)
        .ok_or_else(|| VideoError::NoVideo {
            uri: uri.to_string(),
        })?;
    let decoder_error = |source| VideoError::Decoder {
        uri: uri.to_string(),
        source,
    };
    let index = stream.index();
    let time_base = stream.time_base();
    let start = Some(stream.start_time()).filter(|t| *t != ffmpeg::ffi::AV_NOPTS_VALUE);
    let decoder = codec::context::Context::from_parameters(stream.parameters())
        .and_then(|c| c.decoder().video())
        .map_err(decoder_error)?;
    Ok(Stream {
        uri: uri.to_string(),
        input,
        index,
        time_base,
        start,
        decoder,
        scaler: None,
        scale_to: options.scale_to,
        timed_reads,
        watchdog,
    })
}

impl Stream {
    /// Milliseconds from the stream's start of a timestamp in its time base.
    fn ms(&self, ts: Option<i64>) -> Option<i64> {
        let ts = ts? - self.start.unwrap_or(0);
        let (num, den) = (
            i128::from(self.time_base.numerator()),
            i128::from(self.time_base.denominator()),
        );
        if den == 0 {
            return None;
        }
        i64::try_from(i128::from(ts) * num * 1000 / den).ok()
    }

    /// Reads and decodes to the end of the stream, handing everything to `on`, until it says
    /// stop or `stop` is set. A read error ends the stream with that error.
    pub fn run(
        &mut self,
        stop: &AtomicBool,
        on: &mut dyn FnMut(Decoded<'_>) -> Flow,
    ) -> Result<Ended, VideoError> {
        loop {
            if stop.load(Ordering::Relaxed) {
                return Ok(Ended::Stopped);
            }
            // A packet a read: `av_read_frame` overwrites the packet it is given without
            // releasing its buffer, so reusing one leaked every packet's data (a live camera's
            // whole bitstream); dropping it each time releases it.
            let mut packet = Packet::empty();
            if let Some(watchdog) = self.watchdog.as_ref().filter(|_| self.timed_reads) {
                // An interrupted read can still return what FFmpeg held back (the parser's
                // last frame, flushed): the stream stalled all the same.
                if let Some(e) = watchdog.timed_out("reading", &self.uri) {
                    return Err(e);
                }
                watchdog.arm();
            }
            match packet.read(&mut self.input) {
                Ok(()) => {
                    if let Some(watchdog) = &self.watchdog {
                        watchdog.disarm();
                    }
                }
                // An interrupted read may end in any error, EOF included.
                Err(_) if stop.load(Ordering::Relaxed) => return Ok(Ended::Stopped),
                Err(source) => {
                    let watchdog = self.watchdog.as_ref();
                    if let Some(e) = watchdog.and_then(|w| w.timed_out("reading", &self.uri)) {
                        return Err(e);
                    }
                    if source == ffmpeg::Error::Eof {
                        break;
                    }
                    return Err(VideoError::Read {
                        uri: self.uri.clone(),
                        source,
                    });
                }
            }
            if packet.stream() != self.index {
                continue;
            }
            if let Err(e) = self.decoder.send_packet(&packet) {
                // One bad packet: reported, and decoding goes on with the next.
                let pts_ms = self.ms(packet.pts());
                let reason = format!("undecodable packet: {e}");
                let corrupt = Decoded::Corrupt {
                    pts_ms,
                    reason,
                    frame: false,
                };
                if on(corrupt) == Flow::Stop {
                    return Ok(Ended::Stopped);
                }
            }
            if self.drain(on) == Flow::Stop {
                return Ok(Ended::Stopped);
            }
        }
        // Frames the decoder still holds (reordering delay).
        if self.decoder.send_eof().is_ok() && self.drain(on) == Flow::Stop {
            return Ok(Ended::Stopped);
        }
        Ok(Ended::Eof)
    }

    /// Hands every frame the decoder has ready to `on`.
    fn drain(&mut self, on: &mut dyn FnMut(Decoded<'_>) -> Flow) -> Flow {
        let mut frame = Video::empty();
        loop {
            match self.decoder.receive_frame(&mut frame) {
                Ok(()) => {}
                Err(ffmpeg::Error::Eof) => return Flow::Continue,
                Err(ffmpeg::Error::Other { errno }) if errno == ffmpeg::util::error::EAGAIN => {
                    return Flow::Continue
                }
                Err(e) => {
                    let reason = format!("undecodable frame: {e}");
                    return on(Decoded::Corrupt {
                        pts_ms: None,
                        reason,
                        frame: false,
                    });
                }
            }
            let pts_ms = self.ms(frame.timestamp());
            let flow = if frame.is_corrupt() {
                on(Decoded::Corrupt {
                    pts_ms,
                    reason: "frame decoded with errors".into(),
                    frame: true,
                })
            } else {
                on(Decoded::Frame {
                    pts_ms,
                    image: Image {
                        frame: &frame,
                        scaler: &mut self.scaler,
                        scale_to: self.scale_to,
                    },
                })
            };
            if flow == Flow::Stop {
                return Flow::Stop;
            }
        }
    }
}
