//! What the robot host's test files share.

use frt_robot_host::messages::Image;

/// A 64×48 rgb8 frame whose content depends on `k`.
pub fn frame(k: u32) -> Image {
    let (w, h) = (64u32, 48u32);
    Image::Raw {
        encoding: "rgb8".into(),
        width: w,
        height: h,
        step: w * 3,
        data: (0..w * h * 3)
            .map(|i| ((i * 7 + k * 31) % 251) as u8)
            .collect(),
    }
}
