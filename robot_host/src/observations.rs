//! A folder of observations (what `calibrate --from DIR` records its FP8 ranges on): one
//! sub-folder per observation, taken in name order, each holding
//!
//! * `<camera>.png`, `<camera>.jpg` or `<camera>.jpeg`: one image per configured camera (its
//!   `name`), JPEG or PNG, any size; a camera with `required: false` may be left out;
//! * `state.json`: the joint positions, an object of joint name to position (`{"shoulder":
//!   0.1, …}`) holding every joint of `state.joints`;
//! * `prompt.txt` (optional): the instruction, else the configuration's
//!   `control.initial_subgoal`.
//!
//! Each observation reaches the node through the same checks as a live message (the image
//! decoded and validated, the state checked for its joints and finite values, the prompt for
//! its length), so an observation the node would refuse on the robot is refused here, by
//! observation and file.

use crate::config::Config;
use crate::error::{Error, Result};
use crate::messages::{Image, JointState, Source, Stamp};
use crate::node::Inputs;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Image file extensions and the `CompressedImage` format each is given as.
const IMAGE_KINDS: [(&str, &str); 3] = [("png", "png"), ("jpg", "jpeg"), ("jpeg", "jpeg")];

/// The most observations a folder may hold (each is one inference).
pub const MAX_OBSERVATIONS: usize = 10_000;

/// One observation of a folder, read into memory.
#[derive(Debug)]
pub struct FolderObservation {
    /// The sub-folder.
    pub path: PathBuf,
    /// Per configured camera present: its name and image.
    pub images: Vec<(String, Image)>,
    pub state: JointState,
    /// `prompt.txt`, else the configuration's initial subgoal.
    pub prompt: String,
}

/// A folder of observations (see the module docs).
#[derive(Debug)]
pub struct ObservationFolder {
    pub observations: Vec<FolderObservation>,
}

impl ObservationFolder {
    /// Reads every observation under `dir` for `cfg`'s cameras and joints; a missing required
    /// camera, two images for one camera, or a missing, unreadable or malformed state is an
    /// error naming the file.
    pub fn load(dir: &Path, cfg: &Config) -> Result<ObservationFolder> {
        let what = |p: &Path| p.display().to_string();
        let io = |p: &Path, e: std::io::Error| Error::bad(what(p), e.to_string());
        let mut subs: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| io(dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_dir())
            .collect();
        subs.sort();
        if subs.is_empty() {
            return Err(Error::bad(
                what(dir),
                "no observations: expected one sub-folder per observation (camera images, state.json, optional prompt.txt)",
            ));
        }
        if subs.len() > MAX_OBSERVATIONS {
            return Err(Error::bad(
                what(dir),
                format!("{} observations (at most {MAX_OBSERVATIONS})", subs.len()),
            ));
        }
        let observations = subs
            .into_iter()
            .map(|p| Self::observation(p, cfg))
            .collect::<Result<Vec<_>>>()?;
        Ok(ObservationFolder { observations })
    }

    fn observation(path: PathBuf, cfg: &Config) -> Result<FolderObservation> {
        let what = |p: &Path| p.display().to_string();
        let read = |p: &Path| std::fs::read(p).map_err(|e| Error::bad(what(p), e.to_string()));
        let mut images = Vec::new();
        for cam in &cfg.cameras {
            let found: Vec<(PathBuf, &str)> = IMAGE_KINDS
                .iter()
                .map(|(ext, format)| (path.join(format!("{}.{ext}", cam.name)), *format))
                .filter(|(p, _)| p.is_file())
                .collect();
            match found.as_slice() {
                [] if cam.required => {
                    return Err(Error::bad(
                        what(&path),
                        format!(
                            "no image for camera `{}` ({}.png, .jpg or .jpeg)",
                            cam.name, cam.name
                        ),
                    ));
                }
                [] => {}
                [(p, format)] => images.push((
                    cam.name.clone(),
                    Image::Compressed {
                        format: format.to_string(),
                        data: read(p)?,
                    },
                )),
                _ => {
                    return Err(Error::bad(
                        what(&path),
                        format!("more than one image for camera `{}`", cam.name),
                    ));
                }
            }
        }
        let state_path = path.join("state.json");
        let text = String::from_utf8(read(&state_path)?)
            .map_err(|_| Error::bad(what(&state_path), "not UTF-8 text"))?;
        // JSON is YAML: the configuration's parser reads it.
        let joints: BTreeMap<String, f64> = serde_yaml::from_str(&text).map_err(|e| {
            Error::bad(
                what(&state_path),
                format!("not an object of joint name to position: {e}"),
            )
        })?;
        let (names, position) = joints.into_iter().unzip();
        let prompt_path = path.join("prompt.txt");
        let prompt = if prompt_path.is_file() {
            String::from_utf8(read(&prompt_path)?)
                .map_err(|_| Error::bad(what(&prompt_path), "not UTF-8 text"))?
        } else {
            cfg.control.initial_subgoal.clone()
        };
        Ok(FolderObservation {
            path,
            images,
            state: JointState {
                stamp: 0.0,
                names,
                position,
            },
            prompt,
        })
    }
}

impl FolderObservation {
    /// Delivers this observation to the node's inputs stamped `t` (the node's clock should
    /// read `t`): the prompt first (the same as the last one changes nothing), then each
    /// image and the state. The first refusal is an error naming the observation.
    pub fn deliver(&self, inputs: &Inputs, t: Stamp) -> Result<()> {
        let named = |e: Error| Error::bad(self.path.display().to_string(), e.to_string());
        inputs.subgoal(&self.prompt, Source::Typed).map_err(named)?;
        for (camera, image) in &self.images {
            inputs.frame(camera, t, image).map_err(named)?;
        }
        let mut state = self.state.clone();
        state.stamp = t;
        inputs.state(&state).map_err(named)
    }
}
