//! The vision graph's model: SigLIP So400m/14 over every view at once (openpi `siglip.py`
//! `_Module`: patch embedding, learned positions, pre-LN encoder layers, final LayerNorm;
//! Hugging Face `SiglipVisionTransformer` names), then PaliGemma's projector, writing straight
//! into the image rows of the prefix embeddings. Attention runs per view (one launch for all
//! views on the tensor-core path).

use crate::config::Pi05Config;
use crate::error::Result;
use crate::weights::{PROJECTOR, VISION};
use frt_exec::{Ctx, Stream};
use frt_kernels::{AttentionMask, AttentionPlan, DType, Gemm, Kernels, PatchEmbed, Tensor};
use frt_nn::blocks::encoder::{
    Activation, EncoderActs, EncoderAttention, EncoderLayer, EncoderNames, EncoderStack,
};
use frt_nn::blocks::{LayerNorm, Linear};

const EPS: f32 = 1e-6;

/// SigLIP and the projector, planned (see the module docs).
pub(crate) struct Vision {
    /// f32 pixels the host writes, and their copy in the model's precision (the same tensor
    /// in f32).
    images: Tensor,
    images_dt: Tensor,
    patches: Tensor,
    patch: Linear,
    pos: Tensor,
    embed: PatchEmbed,
    layers: Vec<EncoderLayer>,
    stack: EncoderStack,
    post: LayerNorm,
    proj: Linear,
    g_proj: Gemm,
    /// The prefix embedding rows the projector writes.
    out: Tensor,
}

impl Vision {
    /// Uploads SigLIP and the projector from `root` (openpi naming), allocates the vision
    /// activations and plans every op; `out` is `[views · tokens, llm width]`.
    pub(crate) fn build(
        k: &Kernels,
        s: Stream,
        root: &frt_nn::Path,
        c: &Pi05Config,
        dt: DType,
        out: Tensor,
    ) -> Result<Vision> {
        let ctx: &Ctx = k.ctx();
        let sg = &c.siglip;
        let n_img = c.views * sg.tokens();
        let img_shape = [c.views, sg.image_size, sg.image_size, 3];
        // The host writes f32 pixels (no conversion on the control thread); a model in another
        // precision casts them on the device at the start of the vision graph.
        let images = Tensor::alloc(ctx, "images", DType::F32, &img_shape)?;
        let images_dt = if dt == DType::F32 {
            images.clone()
        } else {
            Tensor::alloc(ctx, "images.model", dt, &img_shape)?
        };
        let act = |name: &str, cols: usize| Tensor::alloc(ctx, name, dt, &[n_img, cols]);
        let patches = act("vision.patches", 3 * sg.patch * sg.patch)?;
        let acts = EncoderActs {
            x: act("vision.x", sg.width)?,
            ln: act("vision.ln", sg.width)?,
            qkv: act("vision.qkv", 3 * sg.width)?,
            attn: act("vision.attn", sg.width)?,
            h: act("vision.mlp", sg.mlp)?,
        };
        let v = root.pp(VISION);
        let emb = v.pp("embeddings");
        let pw = emb.pp("patch_embedding");
        let patch_w = pw
            .upload("weight", &[sg.width, 3, sg.patch, sg.patch], ctx, s, dt)?
            .reshape(&[sg.width, 3 * sg.patch * sg.patch])?;
        let patch = Linear {
            w: patch_w,
            b: pw.upload("bias", &[sg.width], ctx, s, dt)?,
        };
        let pos =
            emb.pp("position_embedding")
                .upload("weight", &[sg.tokens(), sg.width], ctx, s, dt)?;
        let embed = PatchEmbed::new(k, &images_dt, &patches, &patch.w, &acts.x, sg.patch)?;
        let layers: Vec<EncoderLayer> = (0..sg.depth)
            .map(|i| {
                let p = v.pp("encoder.layers").pp(i);
                EncoderLayer::load(&p, &EncoderNames::SIGLIP, sg.width, sg.mlp, ctx, s, dt)
            })
            .collect::<frt_nn::Result<_>>()?;
        let norm = |p: frt_nn::Path| -> Result<LayerNorm> {
            Ok(LayerNorm {
                g: p.upload("weight", &[sg.width], ctx, s, dt)?,
                b: p.upload("bias", &[sg.width], ctx, s, dt)?,
            })
        };
        let post = norm(v.pp("post_layernorm"))?;
        let pr = root.pp(PROJECTOR);
        let proj = Linear {
            w: pr.upload("weight", &[c.llm.width, sg.width], ctx, s, dt)?,
            b: pr.upload("bias", &[c.llm.width], ctx, s, dt)?,
        };
        let g_proj = k.linear(&acts.ln, &proj.w, &out, true, false)?;
        // Attention per view over the view's rows of the fused q|k|v columns.
        let (vt, vhd) = (sg.tokens(), sg.head_dim());
        let mut plans: Vec<AttentionPlan> = Vec::new();
        for view in 0..c.views {
            let rows = |t: &Tensor, col: usize| -> Result<Tensor> {
                let width = t.shape()[1];
                Ok(Tensor::with_layout(
                    t.buffer(),
                    dt,
                    &[vt, sg.heads, vhd],
                    &[width, vhd, 1],
                    t.offset() + view * vt * width + col,
                )?)
            };
            let plan = k.attention_plan_sharing(
                &rows(&acts.qkv, 0)?,
                &rows(&acts.qkv, sg.width)?,
                &rows(&acts.qkv, 2 * sg.width)?,
                &rows(&acts.attn, 0)?,
                &AttentionMask::full(),
                1.0 / (vhd as f32).sqrt(),
                plans.first(),
            )?;
            plans.push(plan);
        }
        // On the tensor-core path the views' attentions run as one launch.
        let batch = k.attention_plan_batch(&plans)?;
        let stack = EncoderStack::new(
            k,
            acts,
            &layers[0],
            EncoderAttention { plans, batch },
            Activation::GeluTanh,
            EPS,
        )?;
        Ok(Vision {
            images,
            images_dt,
            patches,
            patch,
            pos,
            embed,
            layers,
            stack,
            post,
            proj,
            g_proj,
            out,
        })
    }

    /// The f32 pixels (`[views, side, side, 3]`) the host writes before a replay.
    pub(crate) fn images(&self) -> &Tensor {
        &self.images
    }

    /// Records the vision graph's ops on `cs`.
    pub(crate) fn record(&self, k: &Kernels, cs: Stream) -> Result<()> {
        if self.images_dt.dtype() != DType::F32 {
            k.cast(cs, &self.images, &self.images_dt)?;
        }
        let a = self.stack.acts();
        self.embed.run(
            k,
            cs,
            &self.images_dt,
            &self.patches,
            &self.patch.w,
            &self.patch.b,
            &self.pos,
            &a.x,
        )?;
        for l in &self.layers {
            self.stack.record(k, cs, l)?;
        }
        k.layer_norm(cs, &a.x, &self.post.g, &self.post.b, &a.ln, EPS)?;
        self.g_proj
            .run(cs, &a.ln, &self.proj.w, &self.out, Some(&self.proj.b))?;
        Ok(())
    }
}
