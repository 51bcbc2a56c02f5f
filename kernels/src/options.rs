//! The op library's tunables, in one struct set once per [`Kernels`](crate::Kernels): from a
//! configuration (the robot host's `kernels:` section) or, for benchmarks, from the
//! environment ([`KernelOptions::from_env`]). Nothing reads the environment inside an op.

use crate::error::{Error, Result};

/// Which attention path an attention plan takes where both can run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum AttentionPath {
    /// The tensor-core kernel, except for long sequences of wide heads (see
    /// `Kernels::attention_plan`).
    #[default]
    Auto,
    /// The tensor-core kernel (`flash.cu`) wherever it can run.
    Flash,
    /// Two batched GEMMs around a masked softmax.
    Gemm,
}

/// See the module docs. `Default` is what every model runs with unless told otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
pub struct KernelOptions {
    /// The attention path.
    pub attention: AttentionPath,
    /// GEMM plans time cuBLASLt's candidates for large shapes and keep the fastest (`false`:
    /// the heuristic's first choice, the same algorithms every run).
    pub gemm_tuning: bool,
    /// Tuning also times split-reduction forms of the first candidates.
    pub split_k: bool,
    /// Tuning prints its timings on stderr (a `+` after a candidate's time: cuBLASLt enqueues
    /// more than its kernel, such as a split's reduction or a memset of its workspace).
    pub tuning_log: bool,
    /// Key splits of the tensor-core attention kernel (each split's partial results are
    /// combined by a second kernel); `None`: chosen per shape to fill the device (about two
    /// blocks an SM). Capped by the number of key tiles.
    pub attention_splits: Option<usize>,
    /// FP8 linear layers of at most [`FP8_ROWS_MAX`](crate::FP8_ROWS_MAX) rows (an action
    /// expert's tokens) run the library's own kernel (`fp8.cu`: the weight streamed by
    /// tensor-core MMAs, the reduction split over blocks) rather than cuBLASLt's FP8 GEMM.
    pub fp8_rows_kernel: bool,
    /// Where the library's own FP8 kernel runs, on Hopper (`sm_90`) its `wgmma` form, which
    /// multiplies the E4M3 codes as they are (`false`: the `mma.sync` forms, which widen them to
    /// f16 first).
    pub fp8_wgmma: bool,
    /// On Hopper (`sm_90`), bf16/f16 gated-MLP inputs of few rows (`Kernels::geglu_linear`:
    /// an action expert's gate+up and GEGLU) run as one `wgmma` kernel (`false`: cuBLASLt's
    /// GEMM, then the geglu kernel).
    pub geglu_wgmma: bool,
    /// FP8 gated-MLP inputs (`Kernels::linear_geglu_e4m3`: the gate+up GEMM and the GEGLU as
    /// one op, on CUDA where Hopper's `wgmma` runs it) are planned (`false`: that op plans
    /// nothing, and a model runs the gate+up GEMM and the GEGLU apart).
    pub fp8_fused_geglu: bool,
    /// On Hopper (`sm_90`), the library's own `wgmma` GEMMs (the FP8 linear kernels and the
    /// gated-MLP input) are launched with programmatic dependent launch: each starts while the
    /// kernel before it in the stream still runs (the norms, the attention merge and the FP8
    /// gate+up+GEGLU kernel let it),
    /// copies its weight tiles, and waits for that kernel before it reads its input; so is the
    /// tensor-core attention's merge of its key splits, which waits before it reads anything
    /// (`false`: plain launches; the same bits either way).
    pub pdl: bool,
    /// The tensor-core attention at head dim 256 (Gemma's) runs its halves form: two warps
    /// for every 16 rows, each multiplying half of the head dim (`false`: one warp for every
    /// 16 rows over the whole head dim). Where a block's shared memory cannot hold that
    /// form's, the other runs.
    pub flash_halves: bool,
    /// CUDA graphs captured with these ops get their memset nodes (cuBLASLt's memset of its
    /// workspace before some of its GEMMs) as nodes of a kernel storing the same value
    /// (`Ctx::set_memset_nodes_as_kernels`, set on the context when the ops are bound;
    /// `false`: memset nodes as captured).
    pub memset_kernels: bool,
}

impl Default for KernelOptions {
    fn default() -> Self {
        KernelOptions {
            attention: AttentionPath::Auto,
            gemm_tuning: true,
            split_k: true,
            tuning_log: false,
            attention_splits: None,
            fp8_rows_kernel: true,
            fp8_wgmma: true,
            geglu_wgmma: true,
            fp8_fused_geglu: true,
            pdl: true,
            flash_halves: true,
            memset_kernels: true,
        }
    }
}

/// The environment variables [`KernelOptions::from_env`] reads.
pub const ENV_VARS: [&str; 12] = [
    "FRT_ATTENTION",
    "FRT_ATTENTION_SPLITS",
    "FRT_GEMM_TUNING",
    "FRT_GEMM_SPLIT_K",
    "FRT_GEMM_TUNING_LOG",
    "FRT_FP8_ROWS",
    "FRT_FP8_WGMMA",
    "FRT_GEGLU_WGMMA",
    "FRT_FP8_FUSED_GEGLU",
    "FRT_PDL",
    "FRT_FLASH_HALVES",
    "FRT_MEMSET_KERNELS",
];

impl KernelOptions {
    /// The defaults, overridden by `FRT_ATTENTION` (`auto`, `flash`, `gemm`),
    /// `FRT_ATTENTION_SPLITS` (a positive number, or `auto`), `FRT_GEMM_TUNING`,
    /// `FRT_GEMM_SPLIT_K`, `FRT_GEMM_TUNING_LOG`, `FRT_FP8_ROWS`, `FRT_FP8_WGMMA`,
    /// `FRT_GEGLU_WGMMA`, `FRT_FP8_FUSED_GEGLU`, `FRT_PDL`, `FRT_FLASH_HALVES` and
    /// `FRT_MEMSET_KERNELS` (`0` or `1`), for benchmarks. A
    /// value outside those is an error naming the variable.
    pub fn from_env() -> Result<KernelOptions> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// [`from_env`](Self::from_env) over any lookup (tests).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<KernelOptions> {
        let mut o = KernelOptions::default();
        let bad = |name: &str, value: &str, allowed: &str| Error::Options {
            reason: format!("{name}={value:?}: expected {allowed}"),
        };
        let flag = |name: &str, default: bool| -> Result<bool> {
            match var(name).as_deref() {
                None => Ok(default),
                Some("1") => Ok(true),
                Some("0") => Ok(false),
                Some(v) => Err(bad(name, v, "0 or 1")),
            }
        };
        if let Some(v) = var("FRT_ATTENTION") {
            o.attention = match v.as_str() {
                "auto" => AttentionPath::Auto,
                "flash" => AttentionPath::Flash,
                "gemm" => AttentionPath::Gemm,
                _ => return Err(bad("FRT_ATTENTION", &v, "auto, flash or gemm")),
            };
        }
        if let Some(v) = var("FRT_ATTENTION_SPLITS") {
            o.attention_splits = match v.as_str() {
                "auto" => None,
                n => match n.parse::<usize>() {
                    Ok(n) if n > 0 => Some(n),
                    _ => {
                        return Err(bad("FRT_ATTENTION_SPLITS", &v, "a positive number or auto"));
                    }
                },
            };
        }
        o.gemm_tuning = flag("FRT_GEMM_TUNING", o.gemm_tuning)?;
        o.split_k = flag("FRT_GEMM_SPLIT_K", o.split_k)?;
        o.tuning_log = flag("FRT_GEMM_TUNING_LOG", o.tuning_log)?;
        o.fp8_rows_kernel = flag("FRT_FP8_ROWS", o.fp8_rows_kernel)?;
        o.fp8_wgmma = flag("FRT_FP8_WGMMA", o.fp8_wgmma)?;
        o.geglu_wgmma = flag("FRT_GEGLU_WGMMA", o.geglu_wgmma)?;
        o.fp8_fused_geglu = flag("FRT_FP8_FUSED_GEGLU", o.fp8_fused_geglu)?;
        o.pdl = flag("FRT_PDL", o.pdl)?;
        o.flash_halves = flag("FRT_FLASH_HALVES", o.flash_halves)?;
        o.memset_kernels = flag("FRT_MEMSET_KERNELS", o.memset_kernels)?;
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_sets_options_and_bad_values_are_named() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            KernelOptions::from_vars(env(&[])).unwrap(),
            KernelOptions::default()
        );
        let o = KernelOptions::from_vars(env(&[
            ("FRT_ATTENTION", "gemm"),
            ("FRT_GEMM_TUNING", "0"),
            ("FRT_GEMM_TUNING_LOG", "1"),
            ("FRT_FP8_ROWS", "0"),
            ("FRT_FP8_WGMMA", "0"),
            ("FRT_GEGLU_WGMMA", "0"),
            ("FRT_FP8_FUSED_GEGLU", "0"),
            ("FRT_PDL", "0"),
            ("FRT_FLASH_HALVES", "0"),
            ("FRT_MEMSET_KERNELS", "0"),
        ]))
        .unwrap();
        assert_eq!(o.attention, AttentionPath::Gemm);
        assert!(!o.gemm_tuning && o.split_k && o.tuning_log && !o.fp8_rows_kernel);
        assert!(!o.fp8_wgmma && !o.geglu_wgmma && !o.fp8_fused_geglu && !o.pdl);
        assert!(!o.flash_halves && !o.memset_kernels);
        let e = KernelOptions::from_vars(env(&[("FRT_GEMM_SPLIT_K", "yes")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("FRT_GEMM_SPLIT_K") && e.contains("0 or 1"),
            "{e}"
        );
        let e = KernelOptions::from_vars(env(&[("FRT_ATTENTION", "1")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("FRT_ATTENTION"), "{e}");
        let o = KernelOptions::from_vars(env(&[("FRT_ATTENTION_SPLITS", "3")])).unwrap();
        assert_eq!(o.attention_splits, Some(3));
        for bad in ["0", "-2", "many"] {
            let e = KernelOptions::from_vars(move |k: &str| {
                (k == "FRT_ATTENTION_SPLITS").then(|| bad.to_string())
            })
            .unwrap_err()
            .to_string();
            assert!(e.contains("FRT_ATTENTION_SPLITS"), "{e}");
        }
    }
}
