//! Robot presets: openpi's input and output transforms for its shipped policy configs, as
//! its clients send observations (`src/openpi/policies/{droid,aloha,libero}_policy.py`).
//!
//! | preset | images (key → model view) | state | actions returned |
//! |---|---|---|---|
//! | `droid` | `observation/exterior_image_1_left` → 0, `observation/wrist_image_left` → 1 | `observation/joint_position` (7) + `observation/gripper_position` (1) | the first 8 dims |
//! | `libero` | `observation/image` → 0, `observation/wrist_image` → 1 | `observation/state` (8) | the first 7 dims |
//! | `aloha` | `images/cam_high` → 0, `images/cam_left_wrist` → 1, `images/cam_right_wrist` → 2 (absent: masked; `cam_low` accepted, unused) | `state` (14), joints flipped and grippers made angular (`adapt_to_pi`) | the first 14 dims, flipped back, grippers made linear |
//!
//! Images are uint8, or floats in [0, 1] (made uint8 as openpi does, `(255·x).astype(uint8)`),
//! HWC or CHW (CHW when the first dimension is 3, as openpi decides; ALOHA's are CHW). The
//! prompt is `prompt` (str or bytes). Views the model has beyond the preset's are masked.

use super::numpy::{self, Dtype};
use rmpv::Value;
use serde::{Deserialize, Serialize};

/// Which of openpi's robot setups the server speaks for (`serve.preset`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Preset {
    Droid,
    Libero,
    Aloha,
}

/// One RGB image, HWC.
pub struct Rgb {
    pub height: usize,
    pub width: usize,
    pub data: Vec<u8>,
}

/// An observation as the model's host side takes it.
pub struct Parsed {
    /// Per model view (the preset's views; others absent).
    pub images: Vec<Option<Rgb>>,
    /// The robot state in the policy's convention (before normalization).
    pub state: Vec<f32>,
    pub prompt: String,
}

/// ALOHA's joint flips (openpi `_joint_flip_mask`).
const ALOHA_FLIP: [f32; 14] = [1., -1., -1., 1., 1., 1., 1., 1., -1., -1., 1., 1., 1., 1.];
/// ALOHA's gripper dimensions.
const ALOHA_GRIPPERS: [usize; 2] = [6, 13];

impl Preset {
    pub fn name(self) -> &'static str {
        match self {
            Preset::Droid => "droid",
            Preset::Libero => "libero",
            Preset::Aloha => "aloha",
        }
    }

    /// Model views the preset fills.
    pub fn views(self) -> usize {
        match self {
            Preset::Droid | Preset::Libero => 2,
            Preset::Aloha => 3,
        }
    }

    /// State values the preset sends.
    pub fn state_dims(self) -> usize {
        match self {
            Preset::Droid => 8,
            Preset::Libero => 8,
            Preset::Aloha => 14,
        }
    }

    /// Action dimensions returned.
    pub fn action_dims(self) -> usize {
        match self {
            Preset::Droid => 8,
            Preset::Libero => 7,
            Preset::Aloha => 14,
        }
    }

    /// Reads an observation; an error names the key and what was expected.
    pub fn parse(self, obs: &Value, max_pixels: u64) -> Result<Parsed, String> {
        if obs.as_map().is_none() {
            return Err(format!(
                "the observation is {} (expected a dict)",
                numpy::kind(obs)
            ));
        }
        let get = |key: &str| {
            numpy::field(obs, key).ok_or_else(|| {
                format!(
                    "missing key `{key}` (the {} preset reads it; got keys {:?})",
                    self.name(),
                    numpy::keys(obs)
                )
            })
        };
        let prompt = prompt(obs)?;
        let (images, state) = match self {
            Preset::Droid => {
                let base = image(
                    get("observation/exterior_image_1_left")?,
                    "observation/exterior_image_1_left",
                    max_pixels,
                    false,
                )?;
                let wrist = image(
                    get("observation/wrist_image_left")?,
                    "observation/wrist_image_left",
                    max_pixels,
                    false,
                )?;
                let mut state = vector(
                    get("observation/joint_position")?,
                    "observation/joint_position",
                    Some(7),
                )?;
                state.extend(vector(
                    get("observation/gripper_position")?,
                    "observation/gripper_position",
                    Some(1),
                )?);
                (vec![Some(base), Some(wrist)], state)
            }
            Preset::Libero => {
                let base = image(
                    get("observation/image")?,
                    "observation/image",
                    max_pixels,
                    false,
                )?;
                let wrist = image(
                    get("observation/wrist_image")?,
                    "observation/wrist_image",
                    max_pixels,
                    false,
                )?;
                let state = vector(get("observation/state")?, "observation/state", Some(8))?;
                (vec![Some(base), Some(wrist)], state)
            }
            Preset::Aloha => {
                let images = get("images")?;
                if images.as_map().is_none() {
                    return Err(format!(
                        "`images` is {} (expected a dict of cameras)",
                        numpy::kind(images)
                    ));
                }
                const CAMERAS: [&str; 4] =
                    ["cam_high", "cam_low", "cam_left_wrist", "cam_right_wrist"];
                if let Some(k) = numpy::keys(images)
                    .into_iter()
                    .find(|k| !CAMERAS.contains(&k.as_str()))
                {
                    return Err(format!(
                        "`images/{k}`: not one of ALOHA's cameras {CAMERAS:?}"
                    ));
                }
                let cam = |name: &str, required: bool| -> Result<Option<Rgb>, String> {
                    match numpy::field(images, name) {
                        Some(v) => image(v, &format!("images/{name}"), max_pixels, true).map(Some),
                        None if required => {
                            Err(format!("missing key `images/{name}` (ALOHA's base camera)"))
                        }
                        None => Ok(None),
                    }
                };
                let views = vec![
                    cam("cam_high", true)?,
                    cam("cam_left_wrist", false)?,
                    cam("cam_right_wrist", false)?,
                ];
                if let Some(v) = numpy::field(images, "cam_low") {
                    image(v, "images/cam_low", max_pixels, true)?;
                }
                let mut state = vector(get("state")?, "state", Some(14))?;
                aloha_decode_state(&mut state);
                (views, state)
            }
        };
        Ok(Parsed {
            images,
            state,
            prompt,
        })
    }

    /// The output transform on a chunk of `action_dims()` values a row, in place.
    pub fn encode_actions(self, chunk: &mut [f32]) {
        if self == Preset::Aloha {
            for row in chunk.chunks_mut(14) {
                for (x, f) in row.iter_mut().zip(ALOHA_FLIP) {
                    *x *= f;
                }
                for g in ALOHA_GRIPPERS {
                    row[g] = gripper_from_angular(row[g]);
                }
            }
        }
    }
}

/// openpi `_decode_state(adapt_to_pi=True)`: joints flipped, the grippers' linear positions
/// made angles.
fn aloha_decode_state(state: &mut [f32]) {
    for (x, f) in state.iter_mut().zip(ALOHA_FLIP) {
        *x *= f;
    }
    for g in ALOHA_GRIPPERS {
        state[g] = gripper_to_angular(state[g]);
    }
}

fn normalize(x: f64, lo: f64, hi: f64) -> f64 {
    (x - lo) / (hi - lo)
}

fn unnormalize(x: f64, lo: f64, hi: f64) -> f64 {
    x * (hi - lo) + lo
}

/// openpi `_gripper_to_angular`: the ALOHA runtime's linear gripper position to Pi0's angle.
fn gripper_to_angular(v: f32) -> f32 {
    let v = unnormalize(v as f64, 0.01844, 0.05800);
    let (arm, horn) = (0.036, 0.022);
    let a = ((horn * horn + v * v - arm * arm) / (2.0 * horn * v))
        .clamp(-1.0, 1.0)
        .asin();
    normalize(a, 0.5476, 1.6296) as f32
}

/// openpi `_gripper_from_angular`.
fn gripper_from_angular(v: f32) -> f32 {
    normalize(v as f64 + 0.5476, -0.6213, 1.4910) as f32
}

/// The prompt (`prompt`, str or bytes; absent: empty, which the policy refuses).
fn prompt(obs: &Value) -> Result<String, String> {
    match numpy::field(obs, "prompt") {
        None => Err("missing key `prompt` (the task as text)".into()),
        Some(Value::String(s)) => s
            .as_str()
            .map(String::from)
            .ok_or_else(|| "`prompt` is not valid UTF-8".into()),
        Some(Value::Binary(b)) => {
            String::from_utf8(b.clone()).map_err(|_| "`prompt` is not valid UTF-8".into())
        }
        Some(v) => Err(format!(
            "`prompt` is {} (expected a string)",
            numpy::kind(v)
        )),
    }
}

/// A state vector of `n` finite values (a 0-d array or a number counts as one).
fn vector(v: &Value, key: &str, n: Option<usize>) -> Result<Vec<f32>, String> {
    let nums = numpy::numbers(v).map_err(|e| format!("`{key}` is {e}"))?;
    let vals = nums.values();
    if let Some(n) = n {
        if vals.len() != n {
            return Err(format!(
                "`{key}` has shape {:?}; expected {n} values",
                nums.shape()
            ));
        }
    }
    vals.iter()
        .map(|x| {
            let y = *x as f32;
            if y.is_finite() {
                Ok(y)
            } else {
                Err(format!("`{key}` holds a non-finite value ({x})"))
            }
        })
        .collect()
}

/// An image as RGB u8 HWC (see the module docs).
fn image(v: &Value, key: &str, max_pixels: u64, chw_only: bool) -> Result<Rgb, String> {
    let a = numpy::array(v)
        .map_err(|e| format!("`{key}` is {e}"))?
        .ok_or_else(|| {
            format!(
                "`{key}` is {} (expected a numpy image array)",
                numpy::kind(v)
            )
        })?;
    let chw = a.shape.len() == 3 && a.shape[0] == 3;
    let (h, w) = match a.shape[..] {
        [3, h, w] if chw => (h, w),
        [h, w, 3] if !chw_only => (h, w),
        _ => {
            return Err(format!(
                "`{key}` has shape {:?}; expected {}",
                a.shape,
                if chw_only {
                    "[3, height, width]"
                } else {
                    "[height, width, 3] or [3, height, width]"
                }
            ));
        }
    };
    if h == 0 || w == 0 || (h as u64).saturating_mul(w as u64) > max_pixels {
        return Err(format!(
            "`{key}` is {w}×{h} pixels (1 to {max_pixels} accepted)"
        ));
    }
    let to_u8 = |x: f64| -> Result<u8, String> {
        if a.dtype == Dtype::U8 {
            Ok(x as u8)
        } else if a.dtype.is_float() {
            if (0.0..=1.0).contains(&x) {
                Ok((255.0 * x) as u8)
            } else {
                Err(format!(
                    "`{key}` holds {x}: float images must lie in [0, 1]"
                ))
            }
        } else {
            Err(format!(
                "`{key}` has dtype {:?}; expected uint8 or float",
                a.dtype
            ))
        }
    };
    if a.dtype == Dtype::U8 && !chw {
        // The common layout: the bytes as they are.
        return Ok(Rgb {
            height: h,
            width: w,
            data: a.data.to_vec(),
        });
    }
    let mut data = vec![0u8; h * w * 3];
    for y in 0..h {
        for x in 0..w {
            for c in 0..3 {
                let i = if chw {
                    (c * h + y) * w + x
                } else {
                    (y * w + x) * 3 + c
                };
                data[(y * w + x) * 3 + c] = to_u8(a.get(i))?;
            }
        }
    }
    Ok(Rgb {
        height: h,
        width: w,
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ALOHA's transforms against openpi's `_decode_state` / `_encode_actions`
    /// (`adapt_to_pi=True`), values computed by openpi's own functions.
    #[test]
    fn aloha_transforms_match_openpi() {
        let mut state = [
            0.1f32, -0.2, 0.3, 0.4, -0.5, 0.6, 0.03, -0.1, 0.2, -0.3, 0.4, 0.5, -0.6, 0.045,
        ];
        aloha_decode_state(&mut state);
        let want_state = [
            0.1,
            0.2,
            -0.3,
            0.4,
            -0.5,
            0.6,
            -0.9838492224926217,
            -0.1,
            -0.2,
            0.3,
            0.4,
            0.5,
            -0.6,
            -0.9407318795943252,
        ];
        let mut actions = [
            0.1f32, -0.2, 0.3, 0.4, -0.5, 0.6, 0.7, -0.1, 0.2, -0.3, 0.4, 0.5, -0.6, 0.2,
        ];
        Preset::Aloha.encode_actions(&mut actions);
        let want_actions = [
            0.1,
            0.2,
            -0.3,
            0.4,
            -0.5,
            0.6,
            0.8847701557543908,
            -0.1,
            -0.2,
            0.3,
            0.4,
            0.5,
            -0.6,
            0.6480613549211759,
        ];
        for (got, want) in state
            .iter()
            .zip(want_state)
            .chain(actions.iter().zip(want_actions))
        {
            assert!((*got as f64 - want).abs() < 1e-6, "{got} vs {want}");
        }
    }
}
