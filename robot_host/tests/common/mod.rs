//! What the robot host's test files share (each file uses some of it).
#![allow(dead_code)]

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

/// `text` with each `(from, to)` in turn, every `from` replaced by `to`; fails where the text
/// has no `from` then: a test that edits a configuration (the demo's, say) must not silently
/// run the unedited one when that file changes.
pub fn edit(text: &str, edits: &[(&str, &str)]) -> String {
    let mut text = text.to_string();
    for (from, to) in edits {
        assert!(
            text.contains(from),
            "the text to edit has no {from:?} (has the file it came from changed?):\n{text}"
        );
        text = text.replace(from, to);
    }
    text
}
