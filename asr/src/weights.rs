//! Whisper checkpoints: CTranslate2 `model.bin` (faster-whisper's format) and Hugging Face
//! safetensors (`openai/whisper-*` layout), loaded into one host-side representation in f32.
//!
//! CTranslate2 fuses projections: the self-attention `linear_0` is `[q; k; v]` (with a zero
//! key bias), the cross-attention `linear_0` is the query and `linear_1` is `[k; v]`. The
//! Hugging Face layout keeps them apart; both load into the fused form used here.

use crate::config::WhisperConfig;
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// A tensor in host memory (f32).
#[derive(Clone, Debug)]
pub struct HostTensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

#[derive(Clone, Debug)]
pub struct Linear {
    /// `[out, in]`
    pub w: HostTensor,
    /// `[out]`
    pub b: HostTensor,
}

#[derive(Clone, Debug)]
pub struct Norm {
    pub g: HostTensor,
    pub b: HostTensor,
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
    pub enc_pos: HostTensor,
    pub enc_layers: Vec<EncoderLayer>,
    pub enc_ln: Norm,
    /// `[n_vocab, d]`, also the output projection
    pub tok_emb: HostTensor,
    /// `[n_text_ctx, d]`
    pub dec_pos: HostTensor,
    pub dec_layers: Vec<DecoderLayer>,
    pub dec_ln: Norm,
}

/// The checkpoint's tensors, taken by name with shape checks, as f32 (Whisper's upload
/// builds fused projections from them).
struct Store {
    file: PathBuf,
    store: frt_nn::Store,
}

impl Store {
    fn take(&mut self, name: &str, shape: &[usize]) -> Result<HostTensor> {
        let v = self.store.root().get(name, shape)?;
        v.check_finite()?;
        Ok(HostTensor {
            shape: shape.to_vec(),
            data: v.to_f32(),
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

fn zeros(n: usize) -> HostTensor {
    HostTensor {
        shape: vec![n],
        data: vec![0.0; n],
    }
}

fn concat_rows(parts: &[&HostTensor]) -> HostTensor {
    let cols: usize = parts[0].shape[1..].iter().product();
    let rows: usize = parts.iter().map(|p| p.shape[0]).sum();
    let mut shape = parts[0].shape.clone();
    shape[0] = rows;
    let mut data = Vec::with_capacity(rows * cols);
    for p in parts {
        data.extend_from_slice(&p.data);
    }
    HostTensor { shape, data }
}

impl WhisperWeights {
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
        let mut out: Vec<(String, HostTensor)> = Vec::new();
        let split = |l: &Linear, n: usize| -> Vec<Linear> {
            (0..n)
                .map(|k| Linear {
                    w: HostTensor {
                        shape: vec![d, d],
                        data: l.w.data[k * d * d..(k + 1) * d * d].to_vec(),
                    },
                    b: HostTensor {
                        shape: vec![d],
                        data: l.b.data[k * d..(k + 1) * d].to_vec(),
                    },
                })
                .collect()
        };
        let lin = |out: &mut Vec<(String, HostTensor)>, p: &str, l: &Linear, bias: bool| {
            out.push((format!("{p}.weight"), l.w.clone()));
            if bias {
                out.push((format!("{p}.bias"), l.b.clone()));
            }
        };
        let norm = |out: &mut Vec<(String, HostTensor)>, p: &str, n: &Norm| {
            out.push((format!("{p}.weight"), n.g.clone()));
            out.push((format!("{p}.bias"), n.b.clone()));
        };
        lin(&mut out, "model.encoder.conv1", &self.conv1, true);
        lin(&mut out, "model.encoder.conv2", &self.conv2, true);
        out.push((
            "model.encoder.embed_positions.weight".into(),
            self.enc_pos.clone(),
        ));
        for (i, l) in self.enc_layers.iter().enumerate() {
            let p = format!("model.encoder.layers.{i}");
            norm(&mut out, &format!("{p}.self_attn_layer_norm"), &l.attn_ln);
            let qkv = split(&l.qkv, 3);
            lin(&mut out, &format!("{p}.self_attn.q_proj"), &qkv[0], true);
            lin(&mut out, &format!("{p}.self_attn.k_proj"), &qkv[1], false);
            lin(&mut out, &format!("{p}.self_attn.v_proj"), &qkv[2], true);
            lin(&mut out, &format!("{p}.self_attn.out_proj"), &l.out, true);
            norm(&mut out, &format!("{p}.final_layer_norm"), &l.mlp_ln);
            lin(&mut out, &format!("{p}.fc1"), &l.fc1, true);
            lin(&mut out, &format!("{p}.fc2"), &l.fc2, true);
        }
        norm(&mut out, "model.encoder.layer_norm", &self.enc_ln);
        out.push((
            "model.decoder.embed_tokens.weight".into(),
            self.tok_emb.clone(),
        ));
        out.push((
            "model.decoder.embed_positions.weight".into(),
            self.dec_pos.clone(),
        ));
        for (i, l) in self.dec_layers.iter().enumerate() {
            let p = format!("model.decoder.layers.{i}");
            norm(&mut out, &format!("{p}.self_attn_layer_norm"), &l.self_ln);
            let qkv = split(&l.self_qkv, 3);
            lin(&mut out, &format!("{p}.self_attn.q_proj"), &qkv[0], true);
            lin(&mut out, &format!("{p}.self_attn.k_proj"), &qkv[1], false);
            lin(&mut out, &format!("{p}.self_attn.v_proj"), &qkv[2], true);
            lin(
                &mut out,
                &format!("{p}.self_attn.out_proj"),
                &l.self_out,
                true,
            );
            norm(
                &mut out,
                &format!("{p}.encoder_attn_layer_norm"),
                &l.cross_ln,
            );
            lin(
                &mut out,
                &format!("{p}.encoder_attn.q_proj"),
                &l.cross_q,
                true,
            );
            let kv = split(&l.cross_kv, 2);
            lin(&mut out, &format!("{p}.encoder_attn.k_proj"), &kv[0], false);
            lin(&mut out, &format!("{p}.encoder_attn.v_proj"), &kv[1], true);
            lin(
                &mut out,
                &format!("{p}.encoder_attn.out_proj"),
                &l.cross_out,
                true,
            );
            norm(&mut out, &format!("{p}.final_layer_norm"), &l.mlp_ln);
            lin(&mut out, &format!("{p}.fc1"), &l.fc1, true);
            lin(&mut out, &format!("{p}.fc2"), &l.fc2, true);
        }
        norm(&mut out, "model.decoder.layer_norm", &self.dec_ln);
        let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = out
            .into_iter()
            .map(|(n, t)| {
                (
                    n,
                    t.data.iter().flat_map(|v| v.to_le_bytes()).collect(),
                    t.shape,
                )
            })
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
