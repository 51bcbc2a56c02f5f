//! Whisper checkpoints: CTranslate2 `model.bin` (faster-whisper's format) and Hugging Face
//! safetensors (`openai/whisper-*` layout), opened through one [`frt_nn::Store`] (memory-mapped)
//! and described in one layout of [`Weight`]s: names, shapes and finiteness are checked when
//! the checkpoint is opened; values are read when the model uploads them, converted straight
//! into the device tensor's precision (no host copy of the model).
//!
//! CTranslate2 fuses projections: the self-attention `linear_0` is `[q; k; v]` (with a zero
//! key bias), the cross-attention `linear_0` is the query and `linear_1` is `[k; v]`. The
//! Hugging Face layout keeps them apart; both load into the fused form used here.

use crate::config::WhisperConfig;
use crate::error::{Error, Result};
use frt_exec::{Ctx, Stream};
use frt_kernels::{DType, Tensor};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A weight as the checkpoint holds it: the rows of one or more stored tensors (a fused
/// projection stacks several) and of zeros (a bias the checkpoint leaves out), read only when
/// uploaded ([`WhisperWeights::upload`]) or asked for in f32 ([`WhisperWeights::to_f32`]).
#[derive(Clone, Debug)]
pub struct Weight {
    pub shape: Vec<usize>,
    parts: Vec<Part>,
}

#[derive(Clone, Debug)]
enum Part {
    /// A stored tensor, by name.
    Stored(String),
    /// This many zero values.
    Zeros(usize),
}

#[derive(Clone, Debug)]
pub struct Linear {
    /// `[out, in]`
    pub w: Weight,
    /// `[out]`
    pub b: Weight,
}

#[derive(Clone, Debug)]
pub struct Norm {
    pub g: Weight,
    pub b: Weight,
}

#[derive(Clone, Debug)]
pub struct EncoderLayer {
    pub attn_ln: Norm,
    /// `[3d, d]`: q, k, v
    pub qkv: Linear,
    pub out: Linear,
    pub mlp_ln: Norm,
    pub fc1: Linear,
    pub fc2: Linear,
}

#[derive(Clone, Debug)]
pub struct DecoderLayer {
    pub self_ln: Norm,
    /// `[3d, d]`: q, k, v
    pub self_qkv: Linear,
    pub self_out: Linear,
    pub cross_ln: Norm,
    pub cross_q: Linear,
    /// `[2d, d]`: k, v (applied once per utterance to the encoder output)
    pub cross_kv: Linear,
    pub cross_out: Linear,
    pub mlp_ln: Norm,
    pub fc1: Linear,
    pub fc2: Linear,
}

/// Every weight of a Whisper model.
#[derive(Clone, Debug)]
pub struct WhisperWeights {
    pub config: WhisperConfig,
    /// `[d, n_mels, 3]`
    pub conv1: Linear,
    /// `[d, d, 3]`
    pub conv2: Linear,
    /// `[n_audio_ctx, d]`
    pub enc_pos: Weight,
    pub enc_layers: Vec<EncoderLayer>,
    pub enc_ln: Norm,
    /// `[n_vocab, d]`, also the output projection
    pub tok_emb: Weight,
    /// `[n_text_ctx, d]`
    pub dec_pos: Weight,
    pub dec_layers: Vec<DecoderLayer>,
    pub dec_ln: Norm,
    /// Where the values are.
    store: Arc<frt_nn::Store>,
}

/// The checkpoint's tensors, taken by name with shape and finiteness checks.
struct Store {
    file: PathBuf,
    store: frt_nn::Store,
}

impl Store {
    fn take(&mut self, name: &str, shape: &[usize]) -> Result<Weight> {
        self.store.root().get(name, shape)?.check_finite()?;
        Ok(Weight {
            shape: shape.to_vec(),
            parts: vec![Part::Stored(name.to_string())],
        })
    }

    fn shape(&self, name: &str) -> Result<Vec<usize>> {
        Ok(self.store.view(name)?.shape().to_vec())
    }

    fn contains(&self, name: &str) -> bool {
        self.store.contains(name)
    }

    fn bad(&self, reason: impl Into<String>) -> Error {
        frt_nn::Error::BadCheckpoint {
            file: self.file.clone(),
            reason: reason.into(),
        }
        .into()
    }
}

fn zeros(n: usize) -> Weight {
    Weight {
        shape: vec![n],
        parts: vec![Part::Zeros(n)],
    }
}

/// The weights stacked along their first dimension (their trailing dimensions agree).
fn concat_rows(parts: &[&Weight]) -> Weight {
    let mut shape = parts[0].shape.clone();
    shape[0] = parts.iter().map(|p| p.shape[0]).sum();
    Weight {
        shape,
        parts: parts.iter().flat_map(|p| p.parts.iter().cloned()).collect(),
    }
}

impl WhisperWeights {
    /// Uploads `w` as a new tensor of `dtype` (f32, bf16 or f16), each stored part converted
    /// straight from the checkpoint into its rows, ordered on `s`.
    pub fn upload(&self, w: &Weight, ctx: &Ctx, s: Stream, dtype: DType) -> Result<Tensor> {
        let t = Tensor::alloc(ctx, &self.label(w), dtype, &w.shape)?;
        let mut at = 0;
        for part in &w.parts {
            match part {
                Part::Stored(name) => {
                    let v = self.store.view(name)?;
                    v.write_into(&t, s, at)?;
                    at += v.numel();
                }
                Part::Zeros(n) => {
                    let flat = t.reshape(&[t.numel()])?;
                    flat.narrow(0, at, *n)?.write_f32(s, &vec![0.0; *n])?;
                    at += n;
                }
            }
        }
        Ok(t)
    }

    /// `w`'s values in f32 (reads the checkpoint; for tools and tests).
    pub fn to_f32(&self, w: &Weight) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(w.shape.iter().product());
        for part in &w.parts {
            match part {
                Part::Stored(name) => out.extend(self.store.view(name)?.to_f32()?),
                Part::Zeros(n) => out.extend(std::iter::repeat_n(0.0, *n)),
            }
        }
        Ok(out)
    }

    /// A device tensor's name for `w`: its first stored part's.
    fn label(&self, w: &Weight) -> String {
        w.parts
            .iter()
            .find_map(|p| match p {
                Part::Stored(n) => Some(n.clone()),
                Part::Zeros(_) => None,
            })
            .unwrap_or_else(|| "zeros".into())
    }

    /// Loads a model folder: CTranslate2 (`model.bin`) or Hugging Face (`model.safetensors` +
    /// `config.json`), whichever is there.
    pub fn load(dir: &Path) -> Result<WhisperWeights> {
        if !dir.is_dir() {
            return Err(Error::ModelFolder {
                dir: dir.to_path_buf(),
                reason: "not a directory".into(),
            });
        }
        if dir.join("model.bin").is_file() {
            Self::load_ctranslate2(&dir.join("model.bin"))
        } else if dir.join("model.safetensors").is_file() {
            Self::load_safetensors(dir)
        } else {
            Err(Error::ModelFolder {
                dir: dir.to_path_buf(),
                reason:
                    "neither model.bin (CTranslate2) nor model.safetensors (Hugging Face) is there"
                        .into(),
            })
        }
    }

    /// CTranslate2 `model.bin` (binary version ≥ 4; float32 / float16 / bfloat16 variables).
    pub fn load_ctranslate2(file: &Path) -> Result<WhisperWeights> {
        let mut st = Store {
            file: file.to_path_buf(),
            store: frt_nn::Store::ctranslate2(file)?,
        };
        if st.store.scalar("spec:WhisperSpec").is_none() {
            return Err(st.bad("not a Whisper model (its spec is not WhisperSpec)"));
        }
        let scalars = |key: &str| st.store.scalar(key);
        let heads = |key: &str| scalars(key).filter(|h| *h > 0).map(|h| h as usize);
        let emb = st.shape("decoder/embeddings/weight")?;
        let conv1 = st.shape("encoder/conv1/weight")?;
        if emb.len() != 2 || conv1.len() != 3 {
            return Err(st.bad("unexpected embedding or conv1 rank"));
        }
        let rows = |st: &Store, name: &str| -> Result<usize> {
            match st.shape(name)?[..] {
                [n, _] => Ok(n),
                ref s => Err(st.bad(format!("`{name}` has shape {s:?}, expected 2 dimensions"))),
            }
        };
        let count_layers = |st: &Store, prefix: &str| {
            (0..)
                .take_while(|i| st.contains(&format!("{prefix}/layer_{i}/ffn/linear_0/weight")))
                .count()
        };
        let d = conv1[0];
        let config = WhisperConfig {
            n_mels: conv1[1],
            n_audio_ctx: rows(&st, "encoder/position_encodings/encodings")?,
            n_audio_state: d,
            n_audio_head: heads("encoder/num_heads")
                .ok_or_else(|| st.bad("no encoder/num_heads"))?,
            n_audio_layer: count_layers(&st, "encoder"),
            n_vocab: emb[0],
            n_text_ctx: rows(&st, "decoder/position_encodings/encodings")?,
            n_text_state: emb[1],
            n_text_head: heads("decoder/num_heads")
                .ok_or_else(|| st.bad("no decoder/num_heads"))?,
            n_text_layer: count_layers(&st, "decoder"),
        };
        config.check().map_err(|r| st.bad(r))?;
        if config.n_text_state != d {
            return Err(st.bad(format!(
                "encoder width {d} differs from decoder width {}",
                config.n_text_state
            )));
        }
        let lin = |st: &mut Store, p: &str, o: usize, i: usize| -> Result<Linear> {
            let w = st.take(&format!("{p}/weight"), &[o, i])?;
            let b = if st.contains(&format!("{p}/bias")) {
                st.take(&format!("{p}/bias"), &[o])?
            } else {
                zeros(o)
            };
            Ok(Linear { w, b })
        };
        let norm = |st: &mut Store, p: &str| -> Result<Norm> {
            Ok(Norm {
                g: st.take(&format!("{p}/gamma"), &[d])?,
                b: st.take(&format!("{p}/beta"), &[d])?,
            })
        };
        let ff = 4 * d;
        let mut enc_layers = Vec::new();
        for i in 0..config.n_audio_layer {
            let p = format!("encoder/layer_{i}");
            enc_layers.push(EncoderLayer {
                attn_ln: norm(&mut st, &format!("{p}/self_attention/layer_norm"))?,
                qkv: lin(&mut st, &format!("{p}/self_attention/linear_0"), 3 * d, d)?,
                out: lin(&mut st, &format!("{p}/self_attention/linear_1"), d, d)?,
                mlp_ln: norm(&mut st, &format!("{p}/ffn/layer_norm"))?,
                fc1: lin(&mut st, &format!("{p}/ffn/linear_0"), ff, d)?,
                fc2: lin(&mut st, &format!("{p}/ffn/linear_1"), d, ff)?,
            });
        }
        let mut dec_layers = Vec::new();
        for i in 0..config.n_text_layer {
            let p = format!("decoder/layer_{i}");
            dec_layers.push(DecoderLayer {
                self_ln: norm(&mut st, &format!("{p}/self_attention/layer_norm"))?,
                self_qkv: lin(&mut st, &format!("{p}/self_attention/linear_0"), 3 * d, d)?,
                self_out: lin(&mut st, &format!("{p}/self_attention/linear_1"), d, d)?,
                cross_ln: norm(&mut st, &format!("{p}/attention/layer_norm"))?,
                cross_q: lin(&mut st, &format!("{p}/attention/linear_0"), d, d)?,
                cross_kv: lin(&mut st, &format!("{p}/attention/linear_1"), 2 * d, d)?,
                cross_out: lin(&mut st, &format!("{p}/attention/linear_2"), d, d)?,
                mlp_ln: norm(&mut st, &format!("{p}/ffn/layer_norm"))?,
                fc1: lin(&mut st, &format!("{p}/ffn/linear_0"), ff, d)?,
                fc2: lin(&mut st, &format!("{p}/ffn/linear_1"), d, ff)?,
            });
        }
        Ok(WhisperWeights {
            conv1: Linear {
                w: st.take("encoder/conv1/weight", &[d, config.n_mels, 3])?,
                b: st.take("encoder/conv1/bias", &[d])?,
            },
            conv2: Linear {
                w: st.take("encoder/conv2/weight", &[d, d, 3])?,
                b: st.take("encoder/conv2/bias", &[d])?,
            },
            enc_pos: st.take(
                "encoder/position_encodings/encodings",
                &[config.n_audio_ctx, d],
            )?,
            enc_ln: norm(&mut st, "encoder/layer_norm")?,
            tok_emb: st.take("decoder/embeddings/weight", &[config.n_vocab, d])?,
            dec_pos: st.take(
                "decoder/position_encodings/encodings",
                &[config.n_text_ctx, d],
            )?,
            dec_ln: norm(&mut st, "decoder/layer_norm")?,
            enc_layers,
            dec_layers,
            config,
            store: Arc::new(st.store),
        })
    }

    /// Hugging Face safetensors (`model.safetensors` and `config.json` in `dir`).
    pub fn load_safetensors(dir: &Path) -> Result<WhisperWeights> {
        let file = dir.join("model.safetensors");
        let cfg_path = dir.join("config.json");
        let cfg_text = std::fs::read_to_string(&cfg_path).map_err(|source| Error::Io {
            path: cfg_path.clone(),
            source,
        })?;
        let v: serde_json::Value =
            serde_json::from_str(&cfg_text).map_err(|e| Error::BadCheckpoint {
                file: cfg_path.clone(),
                reason: e.to_string(),
            })?;
        let field = |k: &str| {
            v.get(k)
                .and_then(|x| x.as_u64())
                .map(|x| x as usize)
                .ok_or_else(|| Error::BadCheckpoint {
                    file: cfg_path.clone(),
                    reason: format!("no `{k}`"),
                })
        };
        let config = WhisperConfig {
            n_mels: field("num_mel_bins")?,
            n_audio_ctx: field("max_source_positions")?,
            n_audio_state: field("d_model")?,
            n_audio_head: field("encoder_attention_heads")?,
            n_audio_layer: field("encoder_layers")?,
            n_vocab: field("vocab_size")?,
            n_text_ctx: field("max_target_positions")?,
            n_text_state: field("d_model")?,
            n_text_head: field("decoder_attention_heads")?,
            n_text_layer: field("decoder_layers")?,
        };
        config.check().map_err(|reason| Error::BadCheckpoint {
            file: cfg_path.clone(),
            reason,
        })?;
        let mut st = Store {
            store: frt_nn::Store::safetensors(&file, std::slice::from_ref(&file))?,
            file,
        };
        let d = config.n_audio_state;
        let ff = 4 * d;
        let lin = |st: &mut Store, p: &str, o: usize, i: usize| -> Result<Linear> {
            let w = st.take(&format!("{p}.weight"), &[o, i])?;
            let b = if st.contains(&format!("{p}.bias")) {
                st.take(&format!("{p}.bias"), &[o])?
            } else {
                zeros(o)
            };
            Ok(Linear { w, b })
        };
        let norm = |st: &mut Store, p: &str| -> Result<Norm> {
            Ok(Norm {
                g: st.take(&format!("{p}.weight"), &[d])?,
                b: st.take(&format!("{p}.bias"), &[d])?,
            })
        };
        let fused = |st: &mut Store, p: &str, names: &[&str]| -> Result<Linear> {
            let parts: Vec<Linear> = names
                .iter()
                .map(|n| lin(st, &format!("{p}.{n}"), d, d))
                .collect::<Result<_>>()?;
            Ok(Linear {
                w: concat_rows(&parts.iter().map(|l| &l.w).collect::<Vec<_>>()),
                b: concat_rows(&parts.iter().map(|l| &l.b).collect::<Vec<_>>()),
            })
        };
        let mut enc_layers = Vec::new();
        for i in 0..config.n_audio_layer {
            let p = format!("model.encoder.layers.{i}");
            enc_layers.push(EncoderLayer {
                attn_ln: norm(&mut st, &format!("{p}.self_attn_layer_norm"))?,
                qkv: fused(
                    &mut st,
                    &format!("{p}.self_attn"),
                    &["q_proj", "k_proj", "v_proj"],
                )?,
                out: lin(&mut st, &format!("{p}.self_attn.out_proj"), d, d)?,
                mlp_ln: norm(&mut st, &format!("{p}.final_layer_norm"))?,
                fc1: lin(&mut st, &format!("{p}.fc1"), ff, d)?,
                fc2: lin(&mut st, &format!("{p}.fc2"), d, ff)?,
            });
        }
        let mut dec_layers = Vec::new();
        for i in 0..config.n_text_layer {
            let p = format!("model.decoder.layers.{i}");
            dec_layers.push(DecoderLayer {
                self_ln: norm(&mut st, &format!("{p}.self_attn_layer_norm"))?,
                self_qkv: fused(
                    &mut st,
                    &format!("{p}.self_attn"),
                    &["q_proj", "k_proj", "v_proj"],
                )?,
                self_out: lin(&mut st, &format!("{p}.self_attn.out_proj"), d, d)?,
                cross_ln: norm(&mut st, &format!("{p}.encoder_attn_layer_norm"))?,
                cross_q: lin(&mut st, &format!("{p}.encoder_attn.q_proj"), d, d)?,
                cross_kv: fused(&mut st, &format!("{p}.encoder_attn"), &["k_proj", "v_proj"])?,
                cross_out: lin(&mut st, &format!("{p}.encoder_attn.out_proj"), d, d)?,
                mlp_ln: norm(&mut st, &format!("{p}.final_layer_norm"))?,
                fc1: lin(&mut st, &format!("{p}.fc1"), ff, d)?,
                fc2: lin(&mut st, &format!("{p}.fc2"), d, ff)?,
            });
        }
        Ok(WhisperWeights {
            conv1: Linear {
                w: st.take("model.encoder.conv1.weight", &[d, config.n_mels, 3])?,
                b: st.take("model.encoder.conv1.bias", &[d])?,
            },
            conv2: Linear {
                w: st.take("model.encoder.conv2.weight", &[d, d, 3])?,
                b: st.take("model.encoder.conv2.bias", &[d])?,
            },
            enc_pos: st.take(
                "model.encoder.embed_positions.weight",
                &[config.n_audio_ctx, d],
            )?,
            enc_ln: norm(&mut st, "model.encoder.layer_norm")?,
            tok_emb: st.take("model.decoder.embed_tokens.weight", &[config.n_vocab, d])?,
            dec_pos: st.take(
                "model.decoder.embed_positions.weight",
                &[config.n_text_ctx, d],
            )?,
            dec_ln: norm(&mut st, "model.decoder.layer_norm")?,
            enc_layers,
            dec_layers,
            config,
            store: Arc::new(st.store),
        })
    }

    /// Writes these weights as a Hugging Face folder (`model.safetensors`, f32, and
    /// `config.json`), the `openai/whisper-*` layout.
    pub fn write_safetensors(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let d = self.config.n_audio_state;
        // (name, shape, values) in f32.
        type Out = Vec<(String, Vec<usize>, Vec<f32>)>;
        let mut out: Out = Vec::new();
        let values = |w: &Weight| self.to_f32(w);
        // A fused projection's `n` parts: (weight, bias) values of `d` rows each.
        let split = |l: &Linear, n: usize| -> Result<Vec<(Vec<f32>, Vec<f32>)>> {
            let (w, b) = (values(&l.w)?, values(&l.b)?);
            Ok((0..n)
                .map(|k| {
                    (
                        w[k * d * d..(k + 1) * d * d].to_vec(),
                        b[k * d..(k + 1) * d].to_vec(),
                    )
                })
                .collect())
        };
        let part = |out: &mut Out, p: &str, (w, b): &(Vec<f32>, Vec<f32>), bias: bool| {
            out.push((format!("{p}.weight"), vec![d, d], w.clone()));
            if bias {
                out.push((format!("{p}.bias"), vec![d], b.clone()));
            }
        };
        let lin = |out: &mut Out, p: &str, l: &Linear, bias: bool| -> Result<()> {
            out.push((format!("{p}.weight"), l.w.shape.clone(), values(&l.w)?));
            if bias {
                out.push((format!("{p}.bias"), l.b.shape.clone(), values(&l.b)?));
            }
            Ok(())
        };
        let one = |out: &mut Out, name: &str, w: &Weight| -> Result<()> {
            out.push((name.into(), w.shape.clone(), values(w)?));
            Ok(())
        };
        let norm = |out: &mut Out, p: &str, n: &Norm| -> Result<()> {
            one(out, &format!("{p}.weight"), &n.g)?;
            one(out, &format!("{p}.bias"), &n.b)
        };
        lin(&mut out, "model.encoder.conv1", &self.conv1, true)?;
        lin(&mut out, "model.encoder.conv2", &self.conv2, true)?;
        one(
            &mut out,
            "model.encoder.embed_positions.weight",
            &self.enc_pos,
        )?;
        for (i, l) in self.enc_layers.iter().enumerate() {
            let p = format!("model.encoder.layers.{i}");
            norm(&mut out, &format!("{p}.self_attn_layer_norm"), &l.attn_ln)?;
            let qkv = split(&l.qkv, 3)?;
            part(&mut out, &format!("{p}.self_attn.q_proj"), &qkv[0], true);
            part(&mut out, &format!("{p}.self_attn.k_proj"), &qkv[1], false);
            part(&mut out, &format!("{p}.self_attn.v_proj"), &qkv[2], true);
            lin(&mut out, &format!("{p}.self_attn.out_proj"), &l.out, true)?;
            norm(&mut out, &format!("{p}.final_layer_norm"), &l.mlp_ln)?;
            lin(&mut out, &format!("{p}.fc1"), &l.fc1, true)?;
            lin(&mut out, &format!("{p}.fc2"), &l.fc2, true)?;
        }
        norm(&mut out, "model.encoder.layer_norm", &self.enc_ln)?;
        one(&mut out, "model.decoder.embed_tokens.weight", &self.tok_emb)?;
        one(
            &mut out,
            "model.decoder.embed_positions.weight",
            &self.dec_pos,
        )?;
        for (i, l) in self.dec_layers.iter().enumerate() {
            let p = format!("model.decoder.layers.{i}");
            norm(&mut out, &format!("{p}.self_attn_layer_norm"), &l.self_ln)?;
            let qkv = split(&l.self_qkv, 3)?;
            part(&mut out, &format!("{p}.self_attn.q_proj"), &qkv[0], true);
            part(&mut out, &format!("{p}.self_attn.k_proj"), &qkv[1], false);
            part(&mut out, &format!("{p}.self_attn.v_proj"), &qkv[2], true);
            lin(
                &mut out,
                &format!("{p}.self_attn.out_proj"),
                &l.self_out,
                true,
            )?;
            norm(
                &mut out,
                &format!("{p}.encoder_attn_layer_norm"),
                &l.cross_ln,
            )?;
            lin(
                &mut out,
                &format!("{p}.encoder_attn.q_proj"),
                &l.cross_q,
                true,
            )?;
            let kv = split(&l.cross_kv, 2)?;
            part(&mut out, &format!("{p}.encoder_attn.k_proj"), &kv[0], false);
            part(&mut out, &format!("{p}.encoder_attn.v_proj"), &kv[1], true);
            lin(
                &mut out,
                &format!("{p}.encoder_attn.out_proj"),
                &l.cross_out,
                true,
            )?;
            norm(&mut out, &format!("{p}.final_layer_norm"), &l.mlp_ln)?;
            lin(&mut out, &format!("{p}.fc1"), &l.fc1, true)?;
            lin(&mut out, &format!("{p}.fc2"), &l.fc2, true)?;
        }
        norm(&mut out, "model.decoder.layer_norm", &self.dec_ln)?;
        let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = out
            .into_iter()
            .map(|(n, shape, v)| (n, v.iter().flat_map(|x| x.to_le_bytes()).collect(), shape))
            .collect();
        let views: Vec<(String, safetensors::tensor::TensorView)> = bytes
            .iter()
            .map(|(n, b, s)| {
                (
                    n.clone(),
                    safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)
                        .expect("sizes match"),
                )
            })
            .collect();
        let file = dir.join("model.safetensors");
        safetensors::serialize_to_file(views, &None, &file).map_err(|e| Error::BadCheckpoint {
            file: file.clone(),
            reason: e.to_string(),
        })?;
        let c = &self.config;
        let cfg = serde_json::json!({
            "model_type": "whisper",
            "num_mel_bins": c.n_mels, "max_source_positions": c.n_audio_ctx, "d_model": c.n_audio_state,
            "encoder_attention_heads": c.n_audio_head, "encoder_layers": c.n_audio_layer, "vocab_size": c.n_vocab,
            "max_target_positions": c.n_text_ctx, "decoder_attention_heads": c.n_text_head, "decoder_layers": c.n_text_layer,
        });
        let path = dir.join("config.json");
        std::fs::write(&path, serde_json::to_string_pretty(&cfg).unwrap())
            .map_err(|source| Error::Io { path, source })
    }
}
