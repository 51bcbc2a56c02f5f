//! What several of the crate's tests share.

/// `n` values in `[-scale, scale]` from a seeded xorshift generator (inputs and noise the
/// tests and their recordings define the same way).
pub fn rand(seed: u32, n: usize, scale: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x as f32 / u32::MAX as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// The frame sizes the device op `resize_pad_pixels` is checked at (height, width) against a
/// `side × side` output: camera sizes, odd sizes, the output's own size, upscales, an extreme
/// aspect ratio that leaves no rows.
#[allow(dead_code)]
pub const FRAME_SIZES: [(usize, usize); 9] = [
    (480, 640),
    (720, 1280),
    (481, 643),
    (224, 224),
    (223, 225),
    (100, 37),
    (50, 50),
    (7, 300),
    (1, 4000),
];

/// A seeded u8 frame of `h × w × 3`.
#[allow(dead_code)]
pub fn frame(seed: u32, h: usize, w: usize) -> Vec<u8> {
    rand(seed, h * w * 3, 1.0)
        .iter()
        .map(|v| ((v + 1.0) * 127.9) as u8)
        .collect()
}

/// `frame` (`h × w × 3`) through `Kernels::resize_pad_pixels` on `ctx` with the tables of
/// `frt_vla::inputs::resize_tables`, into `side × side × 3` model pixels.
#[allow(dead_code)]
pub fn pixels_on(ctx: &frt_exec::Ctx, frame: &[u8], h: usize, w: usize, side: usize) -> Vec<f32> {
    use frt_kernels::{DType, Kernels, Tensor};
    let s = ctx.stream(0).unwrap();
    let k = Kernels::new(ctx).unwrap();
    let (place, spans, weights) = frt_vla::inputs::resize_tables(h, w, side, side);
    let src = Tensor::alloc(ctx, "frame", DType::U8, &[h, w, 3]).unwrap();
    src.buffer().upload(s, 0, frame).unwrap();
    let sp = Tensor::alloc(ctx, "spans", DType::I32, &[spans.len() / 3, 3]).unwrap();
    sp.buffer().write(s, 0, &spans).unwrap();
    let wt = Tensor::alloc(ctx, "weights", DType::F32, &[weights.len().max(1)]).unwrap();
    if !weights.is_empty() {
        wt.write_f32(s, &weights).unwrap();
    }
    let out = Tensor::alloc(ctx, "pixels", DType::F32, &[side, side, 3]).unwrap();
    k.resize_pad_pixels(s, &src, &sp, &wt, place, &out).unwrap();
    out.read_f32(s).unwrap()
}
