//! The Whisper encoder and decoder as exec graphs (mirrors openai/whisper `model.py`:
//! `AudioEncoder`, `TextDecoder`, `ResidualAttentionBlock`).
//!
//! * **Encoder graph** (one variant, replayed once per utterance): conv1 + GELU, conv2
//!   (stride 2) + GELU, positional embedding, pre-norm attention/MLP blocks, final LayerNorm,
//!   and the cross-attention keys/values of every decoder layer, computed once here.
//! * **Decoder step graphs** keyed by position (`ShapeKey = position`): the token at that
//!   position (read from a one-element device buffer) goes through the decoder; its keys and
//!   values are written into row `position` of preallocated per-layer caches, and its
//!   self-attention reads rows `0..=position`. Output: the logits of the next token.
//!
//! Everything is allocated and captured when the model is built; transcribing only writes the
//! features and the token, replays, and reads the logits.

use crate::config::WhisperConfig;
use crate::error::{Error, Result};
use crate::mel::{LogMel, N_FRAMES};
use crate::weights::{Linear, Norm, WhisperWeights};
use frt_exec::{Buffer, Ctx, Graph, ShapeKey, Stream};
use frt_kernels::{AttentionMask, AttentionPlan, Conv1d, DType, Kernels, Tensor};
use frt_nn::blocks::LayerNorm;
use frt_nn::blocks::encoder::{
    Activation, EncoderActs, EncoderAttention, EncoderLayer, EncoderStack,
};

/// LayerNorm epsilon of Whisper (PyTorch's default).
const LN_EPS: f32 = 1e-5;

struct DLinear {
    w: Tensor,
    b: Tensor,
}

struct DNorm {
    g: Tensor,
    b: Tensor,
}

struct DDecoderLayer {
    self_ln: DNorm,
    self_qkv: DLinear,
    self_out: DLinear,
    cross_ln: DNorm,
    cross_q: DLinear,
    cross_kv: DLinear,
    cross_out: DLinear,
    mlp_ln: DNorm,
    fc1: DLinear,
    fc2: DLinear,
    /// `[n_text_ctx, d]` each.
    k_cache: Tensor,
    v_cache: Tensor,
    /// `[n_audio_ctx, 2d]`: keys | values of the encoder output.
    cross: Tensor,
}

/// What the model's weights are uploaded from and how.
struct Upload<'a> {
    w: &'a WhisperWeights,
    ctx: &'a Ctx,
    s: Stream,
    dt: DType,
}

impl Upload<'_> {
    fn tensor(&self, t: &crate::weights::Weight) -> Result<Tensor> {
        self.w.upload(t, self.ctx, self.s, self.dt)
    }

    fn linear(&self, l: &Linear) -> Result<DLinear> {
        Ok(DLinear {
            w: self.tensor(&l.w)?,
            b: self.tensor(&l.b)?,
        })
    }

    fn norm(&self, n: &Norm) -> Result<DNorm> {
        Ok(DNorm {
            g: self.tensor(&n.g)?,
            b: self.tensor(&n.b)?,
        })
    }
}

/// `[rows, heads, head_dim]` view of columns `col..col + heads·head_dim` of a row-major
/// `[rows, width]` tensor.
fn heads(t: &Tensor, rows: usize, col: usize, heads: usize, head_dim: usize) -> Result<Tensor> {
    let width = t.shape()[t.rank() - 1];
    Ok(Tensor::with_layout(
        t.buffer(),
        t.dtype(),
        &[rows, heads, head_dim],
        &[width, head_dim, 1],
        t.offset() + col,
    )?)
}

/// Options for building a [`WhisperModel`].
#[derive(Clone, Debug)]
pub struct ModelOptions {
    /// Compute precision of weights and activations (logits are always f32). f32 reproduces
    /// the reference decoder token for token; f16/bf16 is faster on GPUs.
    pub dtype: DType,
    /// Most tokens generated per utterance (faster-whisper: 224, half the text context).
    pub max_new_tokens: usize,
    /// The op library's tunables.
    pub kernels: frt_kernels::KernelOptions,
}

/// What greedy decoding needs inside the step graphs: the tokens suppressed at every step,
/// those suppressed at the first generated step too, and that step's position.
#[derive(Clone, Debug)]
pub struct Suppression {
    pub always: Vec<u32>,
    pub at_first: Vec<u32>,
    pub first_position: usize,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            dtype: DType::F32,
            max_new_tokens: 224,
            kernels: Default::default(),
        }
    }
}

/// Whisper on an exec stream (see the module docs).
pub struct WhisperModel {
    k: Kernels,
    s: Stream,
    pub config: WhisperConfig,
    pub options: ModelOptions,
    frontend: LogMel,
    mel: Tensor,
    token: Tensor,
    logits: Tensor,
    /// `[index (i32) | log-probability (f32)]` of the greedy choice.
    choice: frt_exec::Buffer,
    encoder: Graph,
    decoder: Graph,
    /// Positions with a captured decoder step.
    pub positions: usize,
    /// Called before every replay (see [`WhisperModel::set_gate`]).
    gate: Option<Gate>,
}

/// Called before each of Whisper's graph replays; it may block, e.g. until a higher-priority
/// user of the same GPU is between two units of work.
pub type Gate = std::sync::Arc<dyn Fn() + Send + Sync>;

impl WhisperModel {
    /// Uploads `w`, allocates every buffer, and captures the encoder graph and one decoder
    /// step graph per position on stream `s` (the stream transcriptions run on).
    pub fn new(
        ctx: &Ctx,
        s: Stream,
        w: &WhisperWeights,
        options: ModelOptions,
        suppression: &Suppression,
    ) -> Result<WhisperModel> {
        let c = w.config.clone();
        if c.n_audio_state != c.n_text_state
            || c.n_audio_state % c.n_audio_head != 0
            || c.n_text_state % c.n_text_head != 0
        {
            return Err(Error::BadCheckpoint {
                file: "(config)".into(),
                reason: format!("inconsistent dimensions {c:?}"),
            });
        }
        if c.n_audio_ctx * 2 != N_FRAMES {
            return Err(Error::BadCheckpoint {
                file: "(config)".into(),
                reason: format!("n_audio_ctx {} does not match 30 s windows", c.n_audio_ctx),
            });
        }
        let dt = options.dtype;
        let k = Kernels::with_options(ctx, options.kernels)?;
        let d = c.n_audio_state;
        let (t_audio, t_text) = (c.n_audio_ctx, c.n_text_ctx);
        // Weights, each converted from the checkpoint straight into its device tensor.
        let up = Upload { w, ctx, s, dt };
        let conv1 = up.linear(&w.conv1)?;
        let conv2 = up.linear(&w.conv2)?;
        let enc_pos = up.tensor(&w.enc_pos)?;
        let enc: Vec<EncoderLayer> = w
            .enc_layers
            .iter()
            .map(|l| -> Result<_> {
                let ln = |x: &Norm| -> Result<LayerNorm> {
                    let d = up.norm(x)?;
                    Ok(LayerNorm { g: d.g, b: d.b })
                };
                let lin = |x: &Linear| -> Result<frt_nn::blocks::Linear> {
                    let d = up.linear(x)?;
                    Ok(frt_nn::blocks::Linear { w: d.w, b: d.b })
                };
                Ok(EncoderLayer {
                    ln1: ln(&l.attn_ln)?,
                    qkv: lin(&l.qkv)?,
                    out: lin(&l.out)?,
                    ln2: ln(&l.mlp_ln)?,
                    fc1: lin(&l.fc1)?,
                    fc2: lin(&l.fc2)?,
                })
            })
            .collect::<Result<_>>()?;
        let enc_ln = up.norm(&w.enc_ln)?;
        let tok_emb = up.tensor(&w.tok_emb)?;
        let dec_pos = up.tensor(&w.dec_pos)?;
        let dec: Vec<DDecoderLayer> = w
            .dec_layers
            .iter()
            .enumerate()
            .map(|(i, l)| -> Result<_> {
                let n = |x: &str| format!("dec{i}.{x}");
                Ok(DDecoderLayer {
                    self_ln: up.norm(&l.self_ln)?,
                    self_qkv: up.linear(&l.self_qkv)?,
                    self_out: up.linear(&l.self_out)?,
                    cross_ln: up.norm(&l.cross_ln)?,
                    cross_q: up.linear(&l.cross_q)?,
                    cross_kv: up.linear(&l.cross_kv)?,
                    cross_out: up.linear(&l.cross_out)?,
                    mlp_ln: up.norm(&l.mlp_ln)?,
                    fc1: up.linear(&l.fc1)?,
                    fc2: up.linear(&l.fc2)?,
                    k_cache: Tensor::alloc(ctx, &n("k_cache"), dt, &[t_text, d])?,
                    v_cache: Tensor::alloc(ctx, &n("v_cache"), dt, &[t_text, d])?,
                    cross: Tensor::alloc(ctx, &n("cross_kv"), dt, &[t_audio, 2 * d])?,
                })
            })
            .collect::<Result<_>>()?;
        let dec_ln = up.norm(&w.dec_ln)?;

        // Activations of the encoder.
        let mel = Tensor::alloc(ctx, "mel", dt, &[N_FRAMES, c.n_mels])?;
        let h1 = Tensor::alloc(ctx, "enc.h1", dt, &[N_FRAMES, d])?;
        let x = Tensor::alloc(ctx, "enc.x", dt, &[t_audio, d])?;
        let ln = Tensor::alloc(ctx, "enc.ln", dt, &[t_audio, d])?;
        let qkv = Tensor::alloc(ctx, "enc.qkv", dt, &[t_audio, 3 * d])?;
        let attn = Tensor::alloc(ctx, "enc.attn", dt, &[t_audio, d])?;
        let hidden = Tensor::alloc(ctx, "enc.mlp", dt, &[t_audio, 4 * d])?;
        let conv1_plan = Conv1d::new(&k, &mel, &conv1.w, &h1, 1, 1)?;
        let conv2_plan = Conv1d::new(&k, &h1, &conv2.w, &x, 2, 1)?;
        let (ha, dha) = (c.n_audio_head, d / c.n_audio_head);
        let enc_attn: AttentionPlan = k.attention_plan(
            &heads(&qkv, t_audio, 0, ha, dha)?,
            &heads(&qkv, t_audio, d, ha, dha)?,
            &heads(&qkv, t_audio, 2 * d, ha, dha)?,
            &heads(&attn, t_audio, 0, ha, dha)?,
            &AttentionMask::full(),
            1.0 / (dha as f32).sqrt(),
        )?;
        let stack = EncoderStack::new(
            &k,
            EncoderActs {
                x: x.clone(),
                ln: ln.clone(),
                qkv,
                attn,
                h: hidden,
            },
            &enc[0],
            EncoderAttention {
                plans: vec![enc_attn],
                batch: None,
            },
            Activation::Gelu,
            LN_EPS,
        )?;
        let g_cross = k.linear(&ln, &dec[0].cross_kv.w, &dec[0].cross, true, false)?;
        let encoder = Graph::new(ctx, "whisper.encoder", 1);
        encoder.capture(ShapeKey(0), |cs| {
            (|| -> Result<()> {
                conv1_plan.run(&k, cs, &mel, &conv1.w, &conv1.b, &h1)?;
                k.gelu(cs, &h1, &h1)?;
                conv2_plan.run(&k, cs, &h1, &conv2.w, &conv2.b, &x)?;
                k.gelu(cs, &x, &x)?;
                k.add(cs, &x, &enc_pos, &x)?;
                for l in &enc {
                    stack.record(&k, cs, l)?;
                }
                k.layer_norm(cs, &x, &enc_ln.g, &enc_ln.b, &ln, LN_EPS)?;
                for l in &dec {
                    g_cross.run(cs, &ln, &l.cross_kv.w, &l.cross, Some(&l.cross_kv.b))?;
                }
                Ok(())
            })()
        })?;

        // The decoder steps.
        let token = Tensor::alloc(ctx, "token", DType::I32, &[1])?;
        let dx = Tensor::alloc(ctx, "dec.x", dt, &[1, d])?;
        let dln = Tensor::alloc(ctx, "dec.ln", dt, &[1, d])?;
        let dqkv = Tensor::alloc(ctx, "dec.qkv", dt, &[1, 3 * d])?;
        let dq = Tensor::alloc(ctx, "dec.q", dt, &[1, d])?;
        let dattn = Tensor::alloc(ctx, "dec.attn", dt, &[1, d])?;
        let dhidden = Tensor::alloc(ctx, "dec.mlp", dt, &[1, 4 * d])?;
        let logits = Tensor::alloc(ctx, "logits", DType::F32, &[1, c.n_vocab])?;
        let choice = Buffer::alloc(ctx, "choice", 8)?;
        let choice_index = Tensor::new(&choice, DType::I32, &[1])?;
        let choice_logprob = Tensor::with_layout(&choice, DType::F32, &[1], &[1], 1)?;
        let mask_of = |ids: &[&[u32]]| -> Result<Tensor> {
            let mut m = vec![0f32; c.n_vocab];
            for &id in ids.iter().flat_map(|l| l.iter()) {
                if let Some(v) = m.get_mut(id as usize) {
                    *v = f32::NEG_INFINITY;
                }
            }
            let t = Tensor::alloc(ctx, "suppress", DType::F32, &[c.n_vocab])?;
            t.write_f32(s, &m)?;
            Ok(t)
        };
        let mask = mask_of(&[&suppression.always])?;
        let mask_first = mask_of(&[&suppression.always, &suppression.at_first])?;
        let d0 = &dec[0];
        let p_qkv = k.linear(&dln, &d0.self_qkv.w, &dqkv, true, false)?;
        let p_res = k.linear(&dattn, &d0.self_out.w, &dx, true, true)?;
        let p_q = k.linear(&dln, &d0.cross_q.w, &dq, true, false)?;
        let p_fc1 = k.linear(&dln, &d0.fc1.w, &dhidden, true, false)?;
        let p_fc2 = k.linear(&dhidden, &d0.fc2.w, &dx, true, true)?;
        let p_logits = k.linear(&dln, &tok_emb, &logits, false, false)?;
        let (ht, dht) = (c.n_text_head, d / c.n_text_head);
        let scale = 1.0 / (dht as f32).sqrt();
        // Cross-attention reads the same tensors at every position: planned once per layer.
        let cross_attn: Vec<AttentionPlan> = dec
            .iter()
            .map(|l| -> Result<AttentionPlan> {
                Ok(k.attention_plan(
                    &heads(&dq, 1, 0, ht, dht)?,
                    &heads(&l.cross, t_audio, 0, ht, dht)?,
                    &heads(&l.cross, t_audio, d, ht, dht)?,
                    &heads(&dattn, 1, 0, ht, dht)?,
                    &AttentionMask::full(),
                    scale,
                )?)
            })
            .collect::<Result<_>>()?;
        let positions = (2 + options.max_new_tokens).min(t_text);
        let decoder = Graph::new(ctx, "whisper.decoder", 0);
        let es = dt.size();
        let step = |cs: Stream, p: usize| -> Result<()> {
            k.embedding(cs, &token, &tok_emb, &dx, 1.0)?;
            k.add(cs, &dx, &dec_pos.narrow(0, p, 1)?, &dx)?;
            for (l, cross) in dec.iter().zip(&cross_attn) {
                k.layer_norm(cs, &dx, &l.self_ln.g, &l.self_ln.b, &dln, LN_EPS)?;
                p_qkv.run(cs, &dln, &l.self_qkv.w, &dqkv, Some(&l.self_qkv.b))?;
                Buffer::copy(
                    l.k_cache.buffer(),
                    p * d * es,
                    dqkv.buffer(),
                    d * es,
                    d * es,
                    cs,
                )?;
                Buffer::copy(
                    l.v_cache.buffer(),
                    p * d * es,
                    dqkv.buffer(),
                    2 * d * es,
                    d * es,
                    cs,
                )?;
                k.attention(
                    cs,
                    &heads(&dqkv, 1, 0, ht, dht)?,
                    &heads(&l.k_cache.narrow(0, 0, p + 1)?, p + 1, 0, ht, dht)?,
                    &heads(&l.v_cache.narrow(0, 0, p + 1)?, p + 1, 0, ht, dht)?,
                    &heads(&dattn, 1, 0, ht, dht)?,
                    &AttentionMask::full(),
                    scale,
                )?;
                p_res.run(cs, &dattn, &l.self_out.w, &dx, Some(&l.self_out.b))?;
                k.layer_norm(cs, &dx, &l.cross_ln.g, &l.cross_ln.b, &dln, LN_EPS)?;
                p_q.run(cs, &dln, &l.cross_q.w, &dq, Some(&l.cross_q.b))?;
                cross.run(&k, cs)?;
                p_res.run(cs, &dattn, &l.cross_out.w, &dx, Some(&l.cross_out.b))?;
                k.layer_norm(cs, &dx, &l.mlp_ln.g, &l.mlp_ln.b, &dln, LN_EPS)?;
                p_fc1.run(cs, &dln, &l.fc1.w, &dhidden, Some(&l.fc1.b))?;
                k.gelu(cs, &dhidden, &dhidden)?;
                p_fc2.run(cs, &dhidden, &l.fc2.w, &dx, Some(&l.fc2.b))?;
            }
            k.layer_norm(cs, &dx, &dec_ln.g, &dec_ln.b, &dln, LN_EPS)?;
            p_logits.run(cs, &dln, &tok_emb, &logits, None)?;
            let m = if p == suppression.first_position {
                &mask_first
            } else {
                &mask
            };
            k.argmax_logsoftmax(cs, &logits, Some(m), &choice_index, &choice_logprob)?;
            Ok(())
        };
        for p in 0..positions {
            decoder.capture(ShapeKey(p as u64), |cs| step(cs, p))?;
        }
        ctx.sync_stream(s)?;
        Ok(WhisperModel {
            frontend: LogMel::new(c.n_mels),
            k,
            s,
            config: c,
            options,
            mel,
            token,
            logits,
            choice,
            encoder,
            decoder,
            positions,
            gate: None,
        })
    }

    pub fn kernels(&self) -> &Kernels {
        &self.k
    }

    pub fn stream(&self) -> Stream {
        self.s
    }

    /// How many graphs were captured (1 encoder + one decoder step per position).
    pub fn capture_count(&self) -> u64 {
        self.encoder.capture_count() + self.decoder.capture_count()
    }

    /// Sets the gate every replay waits on first (`None`: replay at once). A GPU shared with a
    /// real-time user gets less interference when speech recognition only enqueues work while
    /// that user is idle.
    pub fn set_gate(&mut self, gate: Option<Gate>) {
        self.gate = gate;
    }

    fn pass_gate(&self) {
        if let Some(g) = &self.gate {
            g();
        }
    }

    /// Computes the features of 16 kHz mono audio and runs the encoder (including the
    /// cross-attention keys and values). Returns the frames of content.
    pub fn encode(&self, audio: &[f32]) -> Result<usize> {
        let (x, content) = self.frontend.encoder_input(audio);
        self.mel.write_f32(self.s, &x)?;
        self.pass_gate();
        self.encoder.replay(ShapeKey(0), self.s)?;
        Ok(content)
    }

    fn feed(&self, position: usize, token: u32) -> Result<()> {
        if position >= self.positions {
            return Err(Error::BadAudio {
                what: "decoder".into(),
                reason: format!("position {position} beyond the {} captured", self.positions),
            });
        }
        self.token.buffer().write(self.s, 0, &[token as i32])?;
        self.pass_gate();
        self.decoder.replay(ShapeKey(position as u64), self.s)?;
        Ok(())
    }

    /// Feeds `token` at `position` and copies the logits of the next token into `out`
    /// (`n_vocab` values). Blocks until they are on the host.
    pub fn step_logits(&self, position: usize, token: u32, out: &mut [f32]) -> Result<()> {
        self.feed(position, token)?;
        self.logits.buffer().read(self.s, 0, out)?;
        Ok(())
    }

    /// Feeds `token` at `position` and returns the greedy choice for the next position: its
    /// id and log-probability, with the suppressed tokens masked out (computed on the
    /// device; only these 8 bytes come back).
    pub fn step_greedy(&self, position: usize, token: u32) -> Result<(u32, f32)> {
        self.feed(position, token)?;
        let mut b = [0u8; 8];
        self.choice.download(self.s, 0, &mut b)?;
        let id = i32::from_le_bytes(b[0..4].try_into().unwrap());
        let lp = f32::from_le_bytes(b[4..8].try_into().unwrap());
        Ok((id.max(0) as u32, lp))
    }
}
