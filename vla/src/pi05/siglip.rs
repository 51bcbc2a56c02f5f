//! The vision graph's model: SigLIP So400m/14 over the present views at once (openpi
//! `siglip.py` `_Module`: patch embedding, learned positions, pre-LN encoder layers, final
//! LayerNorm; Hugging Face `SiglipVisionTransformer` names), then PaliGemma's projector,
//! writing straight into the image rows of the prefix embeddings. Attention runs per view
//! (one launch for all views on the tensor-core path). One plan per number of views: the
//! present views are packed into the first slots, an absent one costs nothing.

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

/// The ops planned for `views` views: the first `views` image slots in, the first
/// `views · tokens` rows of the prefix embeddings out.
struct ViewPlan {
    views: usize,
    images: Tensor,
    images_dt: Tensor,
    patches: Tensor,
    embed: PatchEmbed,
    stack: EncoderStack,
    g_proj: Gemm,
    out: Tensor,
}

/// SigLIP and the projector, planned (see the module docs) for each number of views it may
/// encode: the present views sit in the first slots, and only they are encoded.
pub(crate) struct Vision {
    patch: Linear,
    pos: Tensor,
    layers: Vec<EncoderLayer>,
    post: LayerNorm,
    proj: Linear,
    /// The activations for every slot, which each plan narrows.
    full: Full,
    plans: Vec<ViewPlan>,
}

/// The vision activations for every view slot (what a plan for fewer views narrows).
struct Full {
    images: Tensor,
    images_dt: Tensor,
    patches: Tensor,
    acts: EncoderActs,
    out: Tensor,
    config: crate::config::SiglipConfig,
    dt: DType,
}

impl Vision {
    /// Uploads SigLIP and the projector from `root` (openpi naming), allocates the vision
    /// activations for every view slot and plans every op for each count of `counts` views;
    /// `out` is `[views · tokens, llm width]`.
    pub(crate) fn build(
        k: &Kernels,
        s: Stream,
        root: &frt_nn::Path,
        c: &Pi05Config,
        dt: DType,
        out: Tensor,
        counts: &[usize],
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
        let mut v = Vision {
            patch,
            pos,
            layers,
            post,
            proj,
            full: Full {
                images,
                images_dt,
                patches,
                acts,
                out,
                config: c.siglip.clone(),
                dt,
            },
            plans: Vec::new(),
        };
        for &n in counts {
            v.add_plan(k, n)?;
        }
        Ok(v)
    }

    /// Plans the ops for `views` views (nothing when planned already).
    pub(crate) fn add_plan(&mut self, k: &Kernels, views: usize) -> Result<()> {
        if self.plans.iter().any(|p| p.views == views) {
            return Ok(());
        }
        let Full {
            images,
            images_dt,
            patches,
            acts,
            out,
            config: sg,
            dt,
        } = &self.full;
        let (dt, layers, patch, proj) = (*dt, &self.layers, &self.patch, &self.proj);
        let (vt, vhd) = (sg.tokens(), sg.head_dim());
        let rows = views * vt;
        let first = |t: &Tensor| t.narrow(0, 0, rows);
        let a = EncoderActs {
            x: first(&acts.x)?,
            ln: first(&acts.ln)?,
            qkv: first(&acts.qkv)?,
            attn: first(&acts.attn)?,
            h: first(&acts.h)?,
        };
        let (im, im_dt, pt, o) = (
            images.narrow(0, 0, views)?,
            images_dt.narrow(0, 0, views)?,
            first(patches)?,
            out.narrow(0, 0, rows)?,
        );
        let embed = PatchEmbed::new(k, &im_dt, &pt, &patch.w, &a.x, sg.patch)?;
        let g_proj = k.linear(&a.ln, &proj.w, &o, true, false)?;
        // Attention per view over the view's rows of the fused q|k|v columns.
        let mut att: Vec<AttentionPlan> = Vec::new();
        for view in 0..views {
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
                &rows(&a.qkv, 0)?,
                &rows(&a.qkv, sg.width)?,
                &rows(&a.qkv, 2 * sg.width)?,
                &rows(&a.attn, 0)?,
                &AttentionMask::full(),
                1.0 / (vhd as f32).sqrt(),
                att.first(),
            )?;
            att.push(plan);
        }
        // On the tensor-core path the views' attentions run as one launch.
        let batch = k.attention_plan_batch(&att)?;
        let stack = EncoderStack::new(
            k,
            a,
            &layers[0],
            EncoderAttention { plans: att, batch },
            Activation::GeluTanh,
            EPS,
        )?;
        self.plans.push(ViewPlan {
            views,
            images: im,
            images_dt: im_dt,
            patches: pt,
            embed,
            stack,
            g_proj,
            out: o,
        });
        Ok(())
    }

    fn plan(&self, views: usize) -> &ViewPlan {
        self.plans
            .iter()
            .find(|p| p.views == views)
            .expect("a plan for every count the model captures")
    }

    /// The f32 pixels of the first `views` slots (what the variant for `views` encodes).
    pub(crate) fn images_of(&self, views: usize) -> &Tensor {
        &self.plan(views).images
    }

    /// Records the vision graph's ops for the first `views` slots on `cs`.
    pub(crate) fn record(&self, k: &Kernels, cs: Stream, views: usize) -> Result<()> {
        let p = self.plan(views);
        if p.images_dt.dtype() != DType::F32 {
            k.cast(cs, &p.images, &p.images_dt)?;
        }
        let a = p.stack.acts();
        p.embed.run(
            k,
            cs,
            &p.images_dt,
            &p.patches,
            &self.patch.w,
            &self.patch.b,
            &self.pos,
            &a.x,
        )?;
        for l in &self.layers {
            p.stack.record(k, cs, l)?;
        }
        k.layer_norm(cs, &a.x, &self.post.g, &self.post.b, &a.ln, EPS)?;
        p.g_proj
            .run(cs, &a.ln, &self.proj.w, &p.out, Some(&self.proj.b))?;
        Ok(())
    }
}
