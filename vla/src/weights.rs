//! Pi0.5 and Pi0 weights by hierarchical name, in openpi's PyTorch-converted naming
//! (`paligemma_with_expert.paligemma.model.vision_tower.vision_model...`,
//! `...language_model...`, `paligemma_with_expert.gemma_expert.model.layers.{i}...`,
//! `action_in_proj`, `action_out_proj`, and Pi0.5's `time_mlp_in`, `time_mlp_out` or Pi0's
//! `state_proj`, `action_time_mlp_in`, `action_time_mlp_out`). LeRobot's `pi05` and `pi0`
//! checkpoints use the same names under `model.`; the loader detects which.
//!
//! [`expected`] lists every tensor a configuration needs with its shape: the loader checks
//! against it (a missing or mis-shaped tensor is an error naming it and the expected shape),
//! the deterministic random generator fills it, and the writer writes it.

use crate::config::{Pi05Config, Variant};
use crate::error::{Error, Result};
use frt_nn::{Store, View};
use half::bf16;
use std::path::Path;

pub const VISION: &str = "paligemma_with_expert.paligemma.model.vision_tower.vision_model";
pub const PROJECTOR: &str = "paligemma_with_expert.paligemma.model.multi_modal_projector.linear";
pub const LLM: &str = "paligemma_with_expert.paligemma.model.language_model";
pub const EXPERT: &str = "paligemma_with_expert.gemma_expert.model";

/// A generated tensor (f32).
struct HostTensor {
    shape: Vec<usize>,
    data: Vec<f32>,
}

/// How a tensor is initialized by [`random_tensors`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// Normal with std 1/sqrt(fan_in) (the last dimension of a `[out, in]` weight).
    Linear,
    /// Normal with this std.
    Normal(f32),
    /// This constant plus normal noise of std 0.02 (norm gains).
    Around(f32),
}

/// Every tensor the configuration needs: name, shape, initialization.
pub fn expected(c: &Pi05Config) -> Vec<(String, Vec<usize>, Init)> {
    let mut v = Vec::new();
    let mut t = |name: String, shape: Vec<usize>, init: Init| v.push((name, shape, init));
    let s = &c.siglip;
    t(
        format!("{VISION}.embeddings.patch_embedding.weight"),
        vec![s.width, 3, s.patch, s.patch],
        Init::Normal(1.0 / ((3 * s.patch * s.patch) as f32).sqrt()),
    );
    t(
        format!("{VISION}.embeddings.patch_embedding.bias"),
        vec![s.width],
        Init::Normal(0.02),
    );
    t(
        format!("{VISION}.embeddings.position_embedding.weight"),
        vec![s.tokens(), s.width],
        Init::Normal(0.02),
    );
    for i in 0..s.depth {
        let p = format!("{VISION}.encoder.layers.{i}");
        for n in ["layer_norm1", "layer_norm2"] {
            t(format!("{p}.{n}.weight"), vec![s.width], Init::Around(1.0));
            t(format!("{p}.{n}.bias"), vec![s.width], Init::Normal(0.02));
        }
        for n in ["q_proj", "k_proj", "v_proj", "out_proj"] {
            t(
                format!("{p}.self_attn.{n}.weight"),
                vec![s.width, s.width],
                Init::Linear,
            );
            t(
                format!("{p}.self_attn.{n}.bias"),
                vec![s.width],
                Init::Normal(0.02),
            );
        }
        t(
            format!("{p}.mlp.fc1.weight"),
            vec![s.mlp, s.width],
            Init::Linear,
        );
        t(format!("{p}.mlp.fc1.bias"), vec![s.mlp], Init::Normal(0.02));
        t(
            format!("{p}.mlp.fc2.weight"),
            vec![s.width, s.mlp],
            Init::Linear,
        );
        t(
            format!("{p}.mlp.fc2.bias"),
            vec![s.width],
            Init::Normal(0.02),
        );
    }
    t(
        format!("{VISION}.post_layernorm.weight"),
        vec![s.width],
        Init::Around(1.0),
    );
    t(
        format!("{VISION}.post_layernorm.bias"),
        vec![s.width],
        Init::Normal(0.02),
    );
    t(
        format!("{PROJECTOR}.weight"),
        vec![c.llm.width, s.width],
        Init::Linear,
    );
    t(
        format!("{PROJECTOR}.bias"),
        vec![c.llm.width],
        Init::Normal(0.02),
    );
    let g = &c.llm;
    t(
        format!("{LLM}.embed_tokens.weight"),
        vec![c.vocab, g.width],
        Init::Normal(1.0 / (g.width as f32).sqrt()),
    );
    let adaptive_expert = c.variant == Variant::Pi05;
    for (prefix, g, adaptive) in [(LLM, &c.llm, false), (EXPERT, &c.expert, adaptive_expert)] {
        for i in 0..g.depth {
            let p = format!("{prefix}.layers.{i}");
            for n in ["input_layernorm", "post_attention_layernorm"] {
                if adaptive {
                    t(
                        format!("{p}.{n}.dense.weight"),
                        vec![3 * g.width, g.width],
                        Init::Normal(0.2 / (g.width as f32).sqrt()),
                    );
                    t(
                        format!("{p}.{n}.dense.bias"),
                        vec![3 * g.width],
                        Init::Normal(0.1),
                    );
                } else {
                    t(format!("{p}.{n}.weight"), vec![g.width], Init::Normal(0.1));
                }
            }
            t(
                format!("{p}.self_attn.q_proj.weight"),
                vec![g.heads * g.head_dim, g.width],
                Init::Linear,
            );
            t(
                format!("{p}.self_attn.k_proj.weight"),
                vec![g.kv_heads * g.head_dim, g.width],
                Init::Linear,
            );
            t(
                format!("{p}.self_attn.v_proj.weight"),
                vec![g.kv_heads * g.head_dim, g.width],
                Init::Linear,
            );
            t(
                format!("{p}.self_attn.o_proj.weight"),
                vec![g.width, g.heads * g.head_dim],
                Init::Linear,
            );
            t(
                format!("{p}.mlp.gate_proj.weight"),
                vec![g.mlp, g.width],
                Init::Linear,
            );
            t(
                format!("{p}.mlp.up_proj.weight"),
                vec![g.mlp, g.width],
                Init::Linear,
            );
            t(
                format!("{p}.mlp.down_proj.weight"),
                vec![g.width, g.mlp],
                Init::Linear,
            );
        }
        if adaptive {
            t(
                format!("{prefix}.norm.dense.weight"),
                vec![3 * g.width, g.width],
                Init::Normal(0.2 / (g.width as f32).sqrt()),
            );
            t(
                format!("{prefix}.norm.dense.bias"),
                vec![3 * g.width],
                Init::Normal(0.1),
            );
        } else {
            t(
                format!("{prefix}.norm.weight"),
                vec![g.width],
                Init::Normal(0.1),
            );
        }
    }
    let e = c.expert.width;
    t(
        "action_in_proj.weight".into(),
        vec![e, c.action_dim],
        Init::Linear,
    );
    t("action_in_proj.bias".into(), vec![e], Init::Normal(0.02));
    t(
        "action_out_proj.weight".into(),
        vec![c.action_dim, e],
        Init::Linear,
    );
    t(
        "action_out_proj.bias".into(),
        vec![c.action_dim],
        Init::Normal(0.02),
    );
    match c.variant {
        Variant::Pi05 => {
            for n in ["time_mlp_in", "time_mlp_out"] {
                t(format!("{n}.weight"), vec![e, e], Init::Linear);
                t(format!("{n}.bias"), vec![e], Init::Normal(0.02));
            }
        }
        Variant::Pi0 => {
            t(
                "state_proj.weight".into(),
                vec![e, c.action_dim],
                Init::Linear,
            );
            t("state_proj.bias".into(), vec![e], Init::Normal(0.02));
            // `[action; time]` in, one token out.
            t(
                "action_time_mlp_in.weight".into(),
                vec![e, 2 * e],
                Init::Linear,
            );
            t(
                "action_time_mlp_in.bias".into(),
                vec![e],
                Init::Normal(0.02),
            );
            t(
                "action_time_mlp_out.weight".into(),
                vec![e, e],
                Init::Linear,
            );
            t(
                "action_time_mlp_out.bias".into(),
                vec![e],
                Init::Normal(0.02),
            );
        }
    }
    v
}

/// A tensor only one variant has, and that variant: what tells a checkpoint's model.
const VARIANT_MARKS: [(&str, Variant); 2] = [
    ("time_mlp_in.weight", Variant::Pi05),
    ("state_proj.weight", Variant::Pi0),
];

/// The weights of a Pi0.5 model: a [`Store`] whose every tensor [`expected`] names is there
/// with its shape (checked when it is opened), looked up by openpi name.
#[derive(Debug)]
pub struct Pi05Weights {
    pub config: Pi05Config,
    store: Store,
    /// `model.` for LeRobot checkpoints, else empty.
    prefix: &'static str,
}

/// A deterministic generator (SplitMix64 + Box-Muller).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn normal_pair(&mut self) -> (f32, f32) {
        let (u, v) = (self.uniform(), self.uniform());
        let r = (-2.0 * u.ln()).sqrt();
        let a = std::f64::consts::TAU * v;
        ((r * a.cos()) as f32, (r * a.sin()) as f32)
    }
    fn fill_normal(&mut self, out: &mut [f32], mean: f32, std: f32) {
        for pair in out.chunks_mut(2) {
            let (a, b) = self.normal_pair();
            pair[0] = mean + std * a;
            if pair.len() > 1 {
                pair[1] = mean + std * b;
            }
        }
    }
}

fn random_tensor(name: &str, shape: &[usize], init: Init, seed: u64) -> HostTensor {
    let n: usize = shape.iter().product();
    let salt = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let mut rng = Rng(seed ^ salt);
    let mut data = vec![0f32; n];
    match init {
        Init::Linear => {
            rng.fill_normal(&mut data, 0.0, 1.0 / (*shape.last().unwrap() as f32).sqrt())
        }
        Init::Normal(std) => rng.fill_normal(&mut data, 0.0, std),
        Init::Around(c) => rng.fill_normal(&mut data, c, 0.02),
    }
    HostTensor {
        shape: shape.to_vec(),
        data,
    }
}

/// What a checkpoint folder's `config.json` says of the action chunks: openpi's PyTorch
/// conversion (`action_horizon`, `action_dim`), LeRobot's `pi05` (`chunk_size`,
/// `max_action_dim`), or [`Pi05Weights::write`] (a [`Pi05Config`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChunkShape {
    pub action_horizon: Option<usize>,
    pub action_dim: Option<usize>,
    /// The whole model configuration, when `config.json` is one (written by
    /// [`Pi05Weights::write`]: generated checkpoints of any size).
    pub model: Option<Pi05Config>,
}

impl ChunkShape {
    /// Reads `dir/config.json`; a folder without one says nothing (`Default`). A field that is
    /// present but not a positive integer is an error naming it.
    pub fn of_checkpoint(dir: &Path) -> Result<ChunkShape> {
        let path = dir.join("config.json");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ChunkShape::default()),
            Err(source) => return Err(Error::Io { path, source }),
        };
        let bad = |reason: String| Error::BadCheckpoint {
            file: path.clone(),
            reason,
        };
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let field = |names: &[&str]| -> Result<Option<usize>> {
            for n in names {
                if let Some(x) = v.get(*n) {
                    return match x.as_u64() {
                        Some(k) if (1..=100_000).contains(&k) => Ok(Some(k as usize)),
                        _ => Err(bad(format!("`{n}` is {x}; expected a positive integer"))),
                    };
                }
            }
            Ok(None)
        };
        Ok(ChunkShape {
            action_horizon: field(&["action_horizon", "chunk_size"])?,
            action_dim: field(&["action_dim", "max_action_dim"])?,
            model: serde_json::from_value::<Pi05Config>(v.clone())
                .ok()
                .filter(|c| c.validate().is_ok()),
        })
    }
}

/// Deterministic random tensors for any configuration (name, shape, values) in
/// [`expected`]'s order: the same seed gives the same values; each tensor's values depend
/// only on the seed and its name.
pub fn random_tensors(config: &Pi05Config, seed: u64) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    // Each tensor has its own generator (seeded by its name), so the tensors are filled in
    // parallel and the result does not depend on the number of threads.
    let specs = expected(config);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get().min(16));
    let mut out: Vec<(usize, HostTensor)> = Vec::with_capacity(specs.len());
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((name, shape, init)) = specs.get(i) else {
                            return done;
                        };
                        done.push((i, random_tensor(name, shape, *init, seed)));
                    }
                })
            })
            .collect();
        for h in handles {
            out.extend(h.join().expect("weight generator thread"));
        }
    });
    out.sort_by_key(|(i, _)| *i);
    out.into_iter()
        .map(|(i, t)| (specs[i].0.clone(), t.shape, t.data))
        .collect()
}

/// Writes tensors (name in openpi naming, shape, values) as safetensors, f32 or bf16, in one
/// file or in `shards` files with a `model.safetensors.index.json` (LeRobot naming with
/// `lerobot_prefix`), plus `config.json` holding `config`. Writes exactly what it is given
/// (tests write broken checkpoints with it).
pub fn write_tensors(
    dir: &Path,
    config: &Pi05Config,
    tensors: &[(String, Vec<usize>, Vec<f32>)],
    bf16_weights: bool,
    shards: usize,
    lerobot_prefix: bool,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|a, b| tensors[*a].0.cmp(&tensors[*b].0));
    let shards = shards.max(1);
    let per = order.len().div_ceil(shards).max(1);
    let mut index = serde_json::Map::new();
    let prefix = if lerobot_prefix { "model." } else { "" };
    let dtype = if bf16_weights {
        safetensors::Dtype::BF16
    } else {
        safetensors::Dtype::F32
    };
    for (k, chunk) in order.chunks(per).enumerate() {
        let file = if shards == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", k + 1, shards)
        };
        let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = chunk
            .iter()
            .map(|i| {
                let (n, shape, data) = &tensors[*i];
                let b: Vec<u8> = if bf16_weights {
                    data.iter()
                        .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
                        .collect()
                } else {
                    data.iter().flat_map(|v| v.to_le_bytes()).collect()
                };
                (format!("{prefix}{n}"), b, shape.clone())
            })
            .collect();
        let path = dir.join(&file);
        let bad = |reason: String| Error::BadCheckpoint {
            file: path.clone(),
            reason,
        };
        let views = bytes
            .iter()
            .map(|(n, b, s)| {
                safetensors::tensor::TensorView::new(dtype, s.clone(), b)
                    .map(|v| (n.clone(), v))
                    .map_err(|e| bad(format!("`{n}`: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        safetensors::serialize_to_file(views, &None, &path).map_err(|e| bad(e.to_string()))?;
        for (n, _, _) in &bytes {
            index.insert(n.clone(), serde_json::Value::String(file.clone()));
        }
    }
    if shards > 1 {
        let path = dir.join("model.safetensors.index.json");
        let json = serde_json::json!({ "metadata": {}, "weight_map": index });
        std::fs::write(&path, serde_json::to_string_pretty(&json).expect("json"))
            .map_err(|source| Error::Io { path, source })?;
    }
    let path = dir.join("config.json");
    std::fs::write(&path, serde_json::to_string_pretty(config).expect("json"))
        .map_err(|source| Error::Io { path, source })
}

impl Pi05Weights {
    /// The checkpoint's tensors' stored size, in bytes (uploads read them:
    /// [`frt_nn::bytes_read`] counts).
    pub fn stored_bytes(&self) -> u64 {
        self.store.stored_bytes()
    }

    /// The bytes a [`Pi05::build`](crate::Pi05::build) with `options` reads of the stored
    /// tensors: each once but the language model's final norm (the prefix's output, which it
    /// would normalize, is read by nothing), and with SigLIP in FP8 its projections' weights
    /// twice (it keeps their 16-bit copies beside the E4M3 codes quantized from the stored
    /// values). What a build's progress counts up to ([`frt_nn::bytes_read`]).
    pub fn bytes_a_build_reads(&self, options: &crate::Pi05Options) -> u64 {
        let stored = |name: &str| self.get(name).map_or(0, |v| v.stored_len() as u64);
        let mut total = self.stored_bytes() - stored(&format!("{LLM}.norm.weight"));
        if options.fp8.is_some() && options.fp8_vision {
            let n = &frt_nn::blocks::encoder::EncoderNames::SIGLIP;
            for i in 0..self.config.siglip.depth {
                for proj in [n.q, n.k, n.v, n.out, n.fc1, n.fc2] {
                    total += stored(&format!("{VISION}.encoder.layers.{i}.{proj}.weight"));
                }
            }
        }
        total
    }

    /// Deterministic random weights for any configuration (tests, benchmarks; see
    /// [`random_tensors`]), held in memory in f32.
    pub fn random(config: &Pi05Config, seed: u64) -> Pi05Weights {
        let store = Store::from_f32(
            &format!("<random pi05 weights, seed {seed}>"),
            random_tensors(config, seed),
        );
        Pi05Weights {
            config: config.clone(),
            store,
            prefix: "",
        }
    }

    /// The tensor `name` (openpi naming, no `model.` prefix), as stored.
    pub fn get(&self, name: &str) -> Result<View<'_>> {
        Ok(self.store.view(&format!("{}{name}", self.prefix))?)
    }

    /// The root of the hierarchical lookup in openpi naming (under `model.` for LeRobot
    /// checkpoints).
    pub fn root(&self) -> frt_nn::Path<'_> {
        match self.prefix {
            "" => self.store.root(),
            p => self.store.pp(p.trim_end_matches('.')),
        }
    }

    /// The store the weights come from (with the `model.` prefix of LeRobot checkpoints).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Checks every tensor the model uses for non-finite values (reads the checkpoint once;
    /// an upload checks too, slice by slice).
    pub fn check_finite(&self) -> Result<()> {
        for (name, _, _) in expected(&self.config) {
            self.get(&name)?.check_finite()?;
        }
        Ok(())
    }

    /// Writes the weights as safetensors in openpi's naming (see [`write_tensors`]; converts
    /// them to f32 on the host: for generated and test models).
    pub fn write(
        &self,
        dir: &Path,
        bf16_weights: bool,
        shards: usize,
        lerobot_prefix: bool,
    ) -> Result<()> {
        let tensors = expected(&self.config)
            .into_iter()
            .map(|(name, shape, _)| Ok((name.clone(), shape, self.get(&name)?.to_f32()?)))
            .collect::<Result<Vec<_>>>()?;
        write_tensors(
            dir,
            &self.config,
            &tensors,
            bf16_weights,
            shards,
            lerobot_prefix,
        )
    }

    /// The names (as stored) of the weights that a Pi0.5 model with FP8 GEMMs quantizes: the
    /// action expert's projections, and the language model's with `prefix`, SigLIP's with
    /// `vision` (as [`Pi05Options::fp8_prefix`](crate::Pi05Options::fp8_prefix) and
    /// [`fp8_vision`](crate::Pi05Options::fp8_vision) choose). The same lists the FP8
    /// loaders upload (`GemmaFp8::weights`, `EncoderFp8::weights`).
    pub fn fp8_weight_names(&self, prefix: bool, vision: bool) -> Result<Vec<String>> {
        use frt_nn::blocks::encoder::{EncoderFp8, EncoderNames};
        use frt_nn::blocks::gemma::GemmaFp8;
        let c = &self.config;
        if c.variant != Variant::Pi05 {
            return Err(Error::Config {
                reason: format!("{} has no FP8 path (Pi0.5 has one)", c.variant.name()),
            });
        }
        let root = self.root();
        let mut views = Vec::new();
        let mut stacks = vec![(EXPERT, &c.expert)];
        if prefix {
            stacks.push((LLM, &c.llm));
        }
        for (part, g) in stacks {
            for i in 0..g.depth {
                let p = root.pp(part).pp("layers").pp(i);
                views.extend(GemmaFp8::weights(&p, &g.dims())?.into_iter().flatten());
            }
        }
        if vision {
            let sg = &c.siglip;
            for i in 0..sg.depth {
                let p = root.pp(VISION).pp("encoder.layers").pp(i);
                let w = EncoderFp8::weights(&p, &EncoderNames::SIGLIP, sg.width, sg.mlp)?;
                views.extend(w.into_iter().flatten());
            }
        }
        Ok(views.iter().map(|v| v.name().to_string()).collect())
    }

    /// How many of the checkpoint's tensors are pre-quantized weights (E4M3 codes) that a
    /// model with `fp8` stages (`Some((prefix, vision))` as in
    /// [`fp8_weight_names`](Self::fp8_weight_names); `None`: a 16-bit model) does not run in
    /// FP8: its 16-bit layers then compute with their decoded values, not with the weights the
    /// codes were made from.
    pub fn pre_quantized_outside(&self, fp8: Option<(bool, bool)>) -> Result<usize> {
        let stored = self.store.names();
        let codes: Vec<&str> = stored
            .into_iter()
            .filter(|n| self.store.stored_as(n) == Some(frt_nn::Stored::E4M3))
            .collect();
        if codes.is_empty() {
            // The usual checkpoint: nothing to look up.
            return Ok(0);
        }
        let fp8_names: std::collections::HashSet<String> = match fp8 {
            Some((prefix, vision)) if self.config.variant == Variant::Pi05 => {
                self.fp8_weight_names(prefix, vision)?.into_iter().collect()
            }
            _ => Default::default(),
        };
        Ok(codes.iter().filter(|n| !fp8_names.contains(**n)).count())
    }

    /// Writes this checkpoint into the new folder `dir` with the weights
    /// [`fp8_weight_names`](Self::fp8_weight_names) names pre-quantized to E4M3 (per output
    /// feature, the codes and scales an FP8 model computes at load: a model built from it
    /// holds the same FP8 weights and reads half their bytes) and every other tensor as
    /// stored, with the files beside it (`config.json`, norm stats); see
    /// [`Store::write_quantized`].
    pub fn write_fp8(
        &self,
        prefix: bool,
        vision: bool,
        dir: &Path,
    ) -> Result<frt_nn::store::Written> {
        let names = self.fp8_weight_names(prefix, vision)?;
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        Ok(self.store.write_quantized(&names, dir)?)
    }

    /// Opens a checkpoint folder for `config`: `model.safetensors`, or shards listed in
    /// `model.safetensors.index.json`; openpi or LeRobot naming; f32, bf16 or f16; memory-mapped
    /// (nothing is read but the headers until the model uploads its tensors). Every tensor
    /// the configuration needs must be there with its shape.
    pub fn load(dir: &Path, config: &Pi05Config) -> Result<Pi05Weights> {
        config
            .validate()
            .map_err(|reason| Error::Config { reason })?;
        let mut store = Store::open(dir)?;
        let prefix = if store.contains("model.action_in_proj.weight") {
            "model."
        } else {
            ""
        };
        // PaliGemma checkpoints may keep the embedding only as the tied output projection.
        let embed = format!("{prefix}{LLM}.embed_tokens.weight");
        if !store.contains(&embed) {
            store.alias(
                &embed,
                &format!("{prefix}paligemma_with_expert.paligemma.lm_head.weight"),
            );
        }
        // A checkpoint of the other variant is named as such, not by its first missing tensor.
        for (mark, variant) in VARIANT_MARKS {
            if variant != config.variant && store.contains(&format!("{prefix}{mark}")) {
                return Err(Error::Config {
                    reason: format!(
                        "the checkpoint in {} is a {} model (it has `{mark}`), not a {}",
                        dir.display(),
                        variant.name(),
                        config.variant.name()
                    ),
                });
            }
        }
        let root = store.root();
        for (name, shape, _) in expected(config) {
            root.get(format!("{prefix}{name}"), &shape)?;
        }
        Ok(Pi05Weights {
            config: config.clone(),
            store,
            prefix,
        })
    }
}
