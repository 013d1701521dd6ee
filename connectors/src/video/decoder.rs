//! One camera's stream through FFmpeg's libraries: demux (libavformat: files, RTSP, HTTP/HLS),
//! decode (libavcodec: H.264, H.265, …) and convert to RGB8 (libswscale).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

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
}

/// How to open a stream.
#[derive(Clone, Debug)]
pub(crate) struct OpenOptions {
    pub live: bool,
    pub rtsp_tcp: bool,
    pub timeout_ms: u64,
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
}

impl Image<'_> {
    /// `(width, height, pixels)`: RGB8, interleaved, row-major, no padding.
    pub fn rgb(self) -> Result<(u32, u32, Vec<u8>), ffmpeg::Error> {
        let (format, width, height) =
            (self.frame.format(), self.frame.width(), self.frame.height());
        let fits = self.scaler.as_ref().is_some_and(|s| {
            let i = s.input();
            (i.format, i.width, i.height) == (format, width, height)
        });
        if !fits {
            // Same size out: only the pixel format changes (the resize stage scales).
            *self.scaler = Some(scaling::Context::get(
                format,
                width,
                height,
                Pixel::RGB24,
                width,
                height,
                scaling::Flags::BILINEAR
                    | scaling::Flags::ACCURATE_RND
                    | scaling::Flags::FULL_CHR_H_INT,
            )?);
        }
        let Some(scaler) = self.scaler.as_mut() else {
            return Err(ffmpeg::Error::Bug);
        };
        let mut out = Video::empty();
        scaler.run(self.frame, &mut out)?;
        let row = width as usize * 3;
        let stride = out.stride(0);
        let data = out.data(0);
        let mut pixels = Vec::with_capacity(row * height as usize);
        for y in 0..height as usize {
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
}

fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        // Failures are ours to report (dead letters, camera errors), not FFmpeg's log lines.
        ffmpeg::util::log::set_level(ffmpeg::util::log::Level::Fatal);
        ffmpeg::format::network::init();
    });
}

pub(crate) fn open(uri: &str, options: &OpenOptions) -> Result<Stream, VideoError> {
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
    }
    let open_error = |source| VideoError::Open {
        uri: uri.to_string(),
        source,
    };
    let input = format::input_with_dictionary(&uri, dict).map_err(open_error)?;
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
        let mut packet = Packet::empty();
        loop {
            if stop.load(Ordering::Relaxed) {
                return Ok(Ended::Stopped);
            }
            match packet.read(&mut self.input) {
                Ok(()) => {}
                Err(ffmpeg::Error::Eof) => break,
                Err(source) => {
                    return Err(VideoError::Read {
                        uri: self.uri.clone(),
                        source,
                    })
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
                    },
                })
            };
            if flow == Flow::Stop {
                return Flow::Stop;
            }
        }
    }
}
