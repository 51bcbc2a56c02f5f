//! Camera frames: decoding and validation of raw (`sensor_msgs/Image`) and compressed
//! (`sensor_msgs/CompressedImage`, JPEG or PNG) images into packed RGB8, done once, on the I/O
//! side, before a frame reaches the control loop.

/// The largest accepted width or height (an 8K frame is refused before any work): the most the
/// policy resizes on its device.
pub const MAX_SIDE: u32 = frt_vla::MAX_FRAME_SIDE as u32;

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FrameError {
    #[error("unsupported encoding `{0}` (rgb8, bgr8, rgba8, bgra8, mono8)")]
    Encoding(String),
    #[error("{width}×{height} is not a usable size (1 to {MAX_SIDE} per side)")]
    Size { width: u32, height: u32 },
    #[error("step {step} is below width × {bpp} bytes = {need}")]
    Step { step: u32, bpp: u32, need: u64 },
    #[error("{got} bytes of data, step × height = {need}")]
    Length { got: usize, need: u64 },
    #[error("empty image data")]
    Empty,
    #[error("compressed image: {0}")]
    Compressed(String),
    #[error(
        "{width}×{height} = {pixels} pixels, more than the {max} allowed (safety.max_image_pixels)"
    )]
    Pixels {
        width: u32,
        height: u32,
        pixels: u64,
        max: u64,
    },
}

/// A decoded frame: packed RGB8, row-major (`height × width × 3`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rgb8 {
    pub width: u32,
    pub height: u32,
    pub data: Vec<u8>,
}

fn check_size(width: u32, height: u32) -> Result<(), FrameError> {
    if width == 0 || height == 0 || width > MAX_SIDE || height > MAX_SIDE {
        return Err(FrameError::Size { width, height });
    }
    Ok(())
}

/// Decodes a raw image into `out` (reusing its allocation).
pub fn decode_raw(
    encoding: &str,
    width: u32,
    height: u32,
    step: u32,
    data: &[u8],
    out: &mut Rgb8,
) -> Result<(), FrameError> {
    let raw = RawImage::check(encoding, width, height, step, data)?;
    out.width = width;
    out.height = height;
    out.data.clear();
    out.data.resize(raw.rgb8_bytes(), 0);
    raw.convert(&mut out.data);
    Ok(())
}

/// A raw image checked for decoding (see [`decode_raw`]).
pub(crate) struct RawImage<'a> {
    width: usize,
    height: usize,
    step: usize,
    /// Bytes a pixel, and where its red, green and blue are.
    bpp: usize,
    order: [usize; 3],
    data: &'a [u8],
}

impl<'a> RawImage<'a> {
    pub(crate) fn check(
        encoding: &str,
        width: u32,
        height: u32,
        step: u32,
        data: &'a [u8],
    ) -> Result<RawImage<'a>, FrameError> {
        let (bpp, order): (u32, [usize; 3]) = match encoding {
            "rgb8" => (3, [0, 1, 2]),
            "bgr8" => (3, [2, 1, 0]),
            "rgba8" => (4, [0, 1, 2]),
            "bgra8" => (4, [2, 1, 0]),
            "mono8" => (1, [0, 0, 0]),
            e => return Err(FrameError::Encoding(e.to_string())),
        };
        if data.is_empty() {
            return Err(FrameError::Empty);
        }
        check_size(width, height)?;
        let need_row = width as u64 * bpp as u64;
        if (step as u64) < need_row {
            return Err(FrameError::Step {
                step,
                bpp,
                need: need_row,
            });
        }
        let need = step as u64 * height as u64;
        if data.len() as u64 != need {
            return Err(FrameError::Length {
                got: data.len(),
                need,
            });
        }
        Ok(RawImage {
            width: width as usize,
            height: height as usize,
            step: step as usize,
            bpp: bpp as usize,
            order,
            data,
        })
    }

    /// The size of the image in packed RGB8.
    pub(crate) fn rgb8_bytes(&self) -> usize {
        self.width * self.height * 3
    }

    /// Writes the image as packed RGB8 into `out` (at least [`rgb8_bytes`](Self::rgb8_bytes)).
    pub(crate) fn convert(&self, out: &mut [u8]) {
        let (w, bpp, o) = (self.width, self.bpp, self.order);
        let (rgb, bgr) = (bpp == 3 && o == [0, 1, 2], bpp == 3 && o == [2, 1, 0]);
        if (rgb || bgr) && self.step == w * 3 {
            // Packed three bytes a pixel: the whole image at once, not a row at a time.
            let n = self.rgb8_bytes();
            if rgb {
                copy_bytes(&mut out[..n], &self.data[..n]);
            } else {
                swap_red_blue(&mut out[..n], &self.data[..n]);
            }
            return;
        }
        let rows = self.data.chunks_exact(self.step).take(self.height);
        for (row, dst) in rows.zip(out.chunks_exact_mut(w * 3)) {
            if rgb {
                dst.copy_from_slice(&row[..w * 3]);
                continue;
            }
            if bgr {
                swap_red_blue(dst, &row[..w * 3]);
                continue;
            }
            for (px, d) in row[..w * bpp]
                .chunks_exact(bpp)
                .zip(dst.chunks_exact_mut(3))
            {
                d.copy_from_slice(&[px[o[0]], px[o[1]], px[o[2]]]);
            }
        }
    }
}

/// Writes the three-byte pixels of `src` into `dst` (of the same length, a multiple of 3) with
/// their first and third bytes swapped (bgr8 → rgb8). Four pixels at a time as three 32-bit
/// words, whose bytes are moved by shifts (about 1.5× faster than a pixel at a time for a
/// 640×480 frame not in the caches, on the development machine).
pub(crate) fn swap_red_blue(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "swap_red_blue: lengths differ");
    let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let byte = |w: u32, i: u32| (w >> (8 * i)) & 0xff;
    let mut s = src.chunks_exact(12);
    let mut d = dst.chunks_exact_mut(12);
    for (s, d) in (&mut s).zip(&mut d) {
        // In: b0 g0 r0 b1 | g1 r1 b2 g2 | r2 b3 g3 r3. Out: r0 g0 b0 r1 | g1 b1 r2 g2 | b2 r3 g3 b3.
        let (w0, w1, w2) = (word(&s[0..4]), word(&s[4..8]), word(&s[8..12]));
        let o0 = byte(w0, 2) | byte(w0, 1) << 8 | byte(w0, 0) << 16 | byte(w1, 1) << 24;
        let o1 = byte(w1, 0) | byte(w0, 3) << 8 | byte(w2, 0) << 16 | byte(w1, 3) << 24;
        let o2 = byte(w1, 2) | byte(w2, 3) << 8 | byte(w2, 2) << 16 | byte(w2, 1) << 24;
        d[0..4].copy_from_slice(&o0.to_le_bytes());
        d[4..8].copy_from_slice(&o1.to_le_bytes());
        d[8..12].copy_from_slice(&o2.to_le_bytes());
    }
    let (s, d) = (s.remainder(), d.into_remainder());
    for (px, out) in s.chunks_exact(3).zip(d.chunks_exact_mut(3)) {
        out.copy_from_slice(&[px[2], px[1], px[0]]);
    }
}

/// Below this many bytes [`copy_bytes`] is a plain copy.
const STREAM_COPY_MIN: usize = 64 * 1024;

/// Copies `src` into `dst` (of the same length). On x86-64 a copy of at least
/// [`STREAM_COPY_MIN`] bytes writes with non-temporal stores: a camera frame lands in memory
/// that only the device's copy engine reads next, so the stores go around the caches instead
/// of first reading each destination line into them (about 1.4× faster for a 640×480 frame
/// not in the caches, as a frame arriving from the network is not).
pub(crate) fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_bytes: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if src.len() >= STREAM_COPY_MIN {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        // Up to the first 16-byte aligned destination byte, a plain copy.
        let head = dst.as_ptr().align_offset(16).min(dst.len());
        let (dst_head, dst) = dst.split_at_mut(head);
        let (src_head, src) = src.split_at(head);
        dst_head.copy_from_slice(src_head);
        let body = dst.len() / 64 * 64;
        let (dst_body, dst_tail) = dst.split_at_mut(body);
        let (src_body, src_tail) = src.split_at(body);
        for (d, s) in dst_body.chunks_exact_mut(64).zip(src_body.chunks_exact(64)) {
            let (d, s) = (d.as_mut_ptr() as *mut __m128i, s.as_ptr() as *const __m128i);
            // SAFETY: SSE2 is part of x86-64. `s` and `d` are 64 bytes each, within their
            // slices; the loads are unaligned loads, and `d` is 16-byte aligned (the
            // destination from `head` on is, and `body` steps by 64), as the stores need.
            unsafe {
                let v = [
                    _mm_loadu_si128(s),
                    _mm_loadu_si128(s.add(1)),
                    _mm_loadu_si128(s.add(2)),
                    _mm_loadu_si128(s.add(3)),
                ];
                for (i, v) in v.into_iter().enumerate() {
                    _mm_stream_si128(d.add(i), v);
                }
            }
        }
        dst_tail.copy_from_slice(src_tail);
        // SAFETY: SSE is part of x86-64. Orders the non-temporal stores before any later
        // store, such as the release of the lock that hands the frame to the control thread.
        unsafe { _mm_sfence() };
        return;
    }
    dst.copy_from_slice(src);
}

/// Refuses an image of more than `max` pixels.
pub fn check_pixels(width: u32, height: u32, max: u64) -> Result<(), FrameError> {
    let pixels = width as u64 * height as u64;
    if pixels > max {
        return Err(FrameError::Pixels {
            width,
            height,
            pixels,
            max,
        });
    }
    Ok(())
}

/// Decodes a JPEG or PNG image (`format` as in `CompressedImage.format`, e.g. `"jpeg"`,
/// `"rgb8; png compressed bgr8"`; the data's signature decides) into `out`, up to
/// [`MAX_SIDE`] a side.
pub fn decode_compressed(format: &str, data: &[u8], out: &mut Rgb8) -> Result<(), FrameError> {
    decode_compressed_limited(format, data, MAX_SIDE as u64 * MAX_SIDE as u64, out)
}

/// The end of a PNG file: the IEND chunk (length 0, type, CRC).
const PNG_END: [u8; 8] = [0x49, 0x45, 0x4E, 0x44, 0xAE, 0x42, 0x60, 0x82];

/// [`decode_compressed`] refusing images of more than `max_pixels`, read from the header
/// before anything is decoded, and truncated files (a JPEG without its end-of-image marker, a
/// PNG without its end chunk): a decoder would fill the missing rows.
pub fn decode_compressed_limited(
    format: &str,
    data: &[u8],
    max_pixels: u64,
    out: &mut Rgb8,
) -> Result<(), FrameError> {
    if data.is_empty() {
        return Err(FrameError::Empty);
    }
    let kind = image::guess_format(data)
        .map_err(|_| FrameError::Compressed(format!("`{format}`: neither JPEG nor PNG data")))?;
    if !matches!(kind, image::ImageFormat::Jpeg | image::ImageFormat::Png) {
        return Err(FrameError::Compressed(format!(
            "`{format}`: {kind:?} data; JPEG or PNG expected"
        )));
    }
    // Padding after the end is tolerated (some encoders align their buffers).
    let end = data.len() - data.iter().rev().take_while(|b| **b == 0).count();
    let complete = match kind {
        image::ImageFormat::Jpeg => data[..end].ends_with(&[0xFF, 0xD9]),
        _ => data[..end].ends_with(&PNG_END),
    };
    if !complete {
        return Err(FrameError::Compressed(format!(
            "`{format}`: truncated ({kind:?} data without its end marker)"
        )));
    }
    let header = image::ImageReader::with_format(std::io::Cursor::new(data), kind);
    let (w, h) = header
        .into_dimensions()
        .map_err(|e| FrameError::Compressed(e.to_string()))?;
    check_size(w, h)?;
    check_pixels(w, h, max_pixels)?;
    let mut reader = image::ImageReader::with_format(std::io::Cursor::new(data), kind);
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    limits.max_alloc = Some(MAX_SIDE as u64 * MAX_SIDE as u64 * 4);
    reader.limits(limits);
    let img = reader.decode().map_err(|e| match e {
        image::ImageError::Limits(_) => FrameError::Compressed(format!(
            "larger than {MAX_SIDE}×{MAX_SIDE} or too large to decode"
        )),
        e => FrameError::Compressed(e.to_string()),
    })?;
    check_size(img.width(), img.height())?;
    let rgb = img.into_rgb8();
    out.width = rgb.width();
    out.height = rgb.height();
    out.data.clear();
    out.data.extend_from_slice(rgb.as_raw());
    Ok(())
}

/// A decoded camera frame as the node keeps it: packed RGB8 in the first `width × height × 3`
/// bytes of a host buffer of its camera's [`FramePool`]. Not `Clone`: a buffer is free again
/// once the one frame that holds it is dropped.
#[derive(Debug)]
pub(crate) struct CameraFrame {
    pub width: u32,
    pub height: u32,
    pub data: std::sync::Arc<frt_exec::HostBuffer>,
}

/// The most host buffers one camera's frames occupy: the newest frame waiting for a tick, the
/// one the tick holds, and one being written, with one to spare.
const POOL_BUFFERS: usize = 4;

/// A camera's host buffers (page-locked on CUDA, so that the tick only enqueues a frame's
/// upload and copies none of its bytes): the I/O side writes each decoded frame into a buffer
/// no frame holds any more, waiting for that buffer's last upload if it is still pending.
/// Buffers are allocated as frames need them (a larger frame replaces a free smaller buffer)
/// and kept for the camera's life.
pub(crate) struct FramePool {
    ctx: frt_exec::Ctx,
    name: String,
    buffers: std::sync::Mutex<Vec<std::sync::Arc<frt_exec::HostBuffer>>>,
}

impl FramePool {
    pub fn new(ctx: &frt_exec::Ctx, camera: &str) -> FramePool {
        FramePool {
            ctx: ctx.clone(),
            name: format!("camera `{camera}` frame"),
            buffers: Default::default(),
        }
    }

    /// `rgb` copied into a free buffer of the pool.
    pub fn frame(&self, rgb: &Rgb8) -> Result<CameraFrame, String> {
        self.frame_with(rgb.width, rgb.height, |out| copy_bytes(out, &rgb.data))
    }

    /// A `width × height` RGB8 frame that `fill` writes (given exactly its bytes) into a free
    /// buffer of the pool.
    pub fn frame_with(
        &self,
        width: u32,
        height: u32,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<CameraFrame, String> {
        use std::sync::Arc;
        let need = width as usize * height as usize * 3;
        let mut buffers = self.buffers.lock().unwrap_or_else(|p| p.into_inner());
        // Handles are only cloned here, under the lock: a count of 1 (the pool's) stays 1.
        let free = |b: &Arc<frt_exec::HostBuffer>| Arc::strong_count(b) == 1;
        let mut buf = match buffers.iter().position(|b| free(b) && b.bytes() >= need) {
            Some(i) => buffers.swap_remove(i),
            None => {
                if buffers.len() >= POOL_BUFFERS {
                    // Too small for this frame: replaced by one that fits.
                    let Some(i) = buffers.iter().position(free) else {
                        return Err(format!(
                            "every one of its {POOL_BUFFERS} frame buffers is in use"
                        ));
                    };
                    buffers.swap_remove(i);
                }
                let b = frt_exec::HostBuffer::alloc(&self.ctx, &self.name, need.max(1))
                    .map_err(|e| format!("no memory for its frames: {e}"))?;
                Arc::new(b)
            }
        };
        let only = Arc::get_mut(&mut buf).expect("a free buffer has no other handle");
        let out = only.write().map_err(|e| format!("frame buffer: {e}"))?;
        fill(&mut out[..need]);
        buffers.push(buf.clone());
        Ok(CameraFrame {
            width,
            height,
            data: buf,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rgb(w: u32, h: u32, seed: u8) -> Rgb8 {
        Rgb8 {
            width: w,
            height: h,
            data: (0..w * h * 3)
                .map(|i| (i as u8).wrapping_mul(seed))
                .collect(),
        }
    }

    /// [`copy_bytes`] copies every byte whatever the lengths and the alignments of both
    /// slices, with the non-temporal stores (from [`STREAM_COPY_MIN`] bytes) or without.
    #[test]
    fn copy_bytes_copies_every_byte_at_any_alignment() {
        let n = STREAM_COPY_MIN + 300;
        let src: Vec<u8> = (0..n + 64).map(|i| (i * 31 % 251) as u8).collect();
        let mut dst = vec![0u8; n + 64];
        for len in [
            0,
            1,
            63,
            4097,
            STREAM_COPY_MIN - 1,
            STREAM_COPY_MIN,
            n - 17,
            n,
        ] {
            for (so, d_off) in [(0, 0), (1, 0), (0, 3), (5, 9), (15, 17), (32, 48)] {
                dst.fill(0);
                copy_bytes(&mut dst[d_off..d_off + len], &src[so..so + len]);
                assert_eq!(&dst[d_off..d_off + len], &src[so..so + len], "len {len}");
                assert!(dst[..d_off].iter().all(|&b| b == 0), "before, len {len}");
                let after = &dst[d_off + len..];
                assert!(after.iter().all(|&b| b == 0), "after, len {len}");
            }
        }
    }

    /// [`swap_red_blue`] gives a pixel at a time's swap at every length (whole groups of four
    /// pixels and the ones left over).
    #[test]
    fn swap_red_blue_swaps_every_pixel() {
        let src: Vec<u8> = (0..640 * 3 + 3).map(|i| (i * 37 % 253) as u8).collect();
        for px in [0, 1, 3, 4, 5, 7, 8, 640, 641] {
            let n = px * 3;
            let want: Vec<u8> = src[..n]
                .chunks_exact(3)
                .flat_map(|p| [p[2], p[1], p[0]])
                .collect();
            let mut got = vec![0u8; n];
            swap_red_blue(&mut got, &src[..n]);
            assert_eq!(got, want, "{px} pixels");
        }
    }

    /// Frames land in the pool's buffers; a buffer is reused once its frame is dropped, never
    /// while a frame holds it; a larger frame replaces a free smaller buffer; with every
    /// buffer held the frame is refused by reason.
    #[test]
    fn frame_pool_reuses_buffers_no_frame_holds() {
        let ctx = frt_exec::Ctx::host().unwrap();
        let pool = FramePool::new(&ctx, "base");
        let a = rgb(4, 3, 7);
        let f1 = pool.frame(&a).unwrap();
        assert_eq!((f1.width, f1.height), (4, 3));
        assert_eq!(&f1.data.as_slice()[..36], &a.data[..]);
        // Held: the next frame goes elsewhere and leaves the first intact.
        let b = rgb(4, 3, 11);
        let f2 = pool.frame(&b).unwrap();
        assert!(!std::sync::Arc::ptr_eq(&f1.data, &f2.data));
        assert_eq!(&f1.data.as_slice()[..36], &a.data[..]);
        // Dropped: its buffer is taken again.
        let first = std::sync::Arc::as_ptr(&f1.data);
        drop(f1);
        let f3 = pool.frame(&rgb(2, 2, 3)).unwrap();
        assert_eq!(std::sync::Arc::as_ptr(&f3.data), first);
        // Every buffer held: refused.
        let f4 = pool.frame(&b).unwrap();
        let f5 = pool.frame(&b).unwrap();
        let e = pool.frame(&b).unwrap_err();
        assert!(e.contains("in use"), "{e}");
        // A larger frame replaces a free buffer too small for it.
        drop(f5);
        let big = rgb(40, 30, 5);
        let f6 = pool.frame(&big).unwrap();
        assert!(f6.data.bytes() >= big.data.len());
        assert_eq!(&f6.data.as_slice()[..big.data.len()], &big.data[..]);
        assert_eq!(&f2.data.as_slice()[..36], &b.data[..]);
        drop((f2, f3, f4));
    }
}
